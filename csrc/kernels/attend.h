// Causal attention of one query row over the cached cells of one KV head, for the nq query heads that
// share that KV head (GQA): o[h] = softmax(scale * q[h] . K^T) V over cells 0..n-1.
//
// Exactness contract: o[h] depends only on q[h], the cells and n; never on nq, on which heads share
// the call, on the window's T or on the thread partition. Each ISA path has its own (fixed) summation
// order, so paths may differ from each other in the last bits (the model is checked against transformers
// within 1e-4 on every path); one session always uses one path, so windows stay bit-identical to serial.
#pragma once
#include <cstdint>

namespace strata {

struct AttendArgs {
  const float* q;    // query head h at q + h * ldq, hd floats
  int64_t ldq;
  int nq;            // query heads sharing this KV head
  const float* k;    // cell c's key at k + c * ldkv, hd floats
  const float* v;    // cell c's value at v + c * ldkv
  int64_t ldkv;
  int64_t n;         // cells 0..n-1 (causal: n = pos + 1)
  int64_t hd;
  float scale;
  float* o;          // head h's output at o + h * ldo, hd floats
  int64_t ldo;
};

// Scratch: n floats per call (one head at a time).
void attend_ref(const AttendArgs& a, float* scratch);
// AVX-512 (kernels/cpu/attend_avx512.cpp); hd % 16 == 0 and hd <= 256, else it calls attend_ref.
void attend_avx512(const AttendArgs& a, float* scratch);
// The active ISA's path.
void attend(const AttendArgs& a, float* scratch);

}  // namespace strata
