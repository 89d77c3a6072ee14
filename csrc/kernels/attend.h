// Causal attention over the cached cells of one KV head for the query heads that share it (GQA), for T
// consecutive rows of a window: row t, head j gets o = softmax(scale * q . K^T) V over cells 0..n+t-1.
//
// Exactness contract: each output depends only on its own query, the cells and its cell count; never on
// T, on which rows or heads share the call, or on the thread partition (the fast path blocks cells at
// fixed multiples of 16, whatever the call). Each ISA path has its own fixed summation order, so paths
// may differ from each other in the last bits (the model is checked against transformers within 1e-4 on
// every path); one session always uses one path, so windows stay bit-identical to serial decoding.
#pragma once
#include <cstdint>

namespace strata {

struct AttendArgs {
  const float* q;    // row t, head j at q + t * ldq_t + j * ldq_h, hd floats
  int64_t ldq_t, ldq_h;
  int T;             // rows
  int nh;            // query heads sharing this KV head
  const float* k;    // cell c's key at k + c * ldkv, hd floats
  const float* v;    // cell c's value at v + c * ldkv
  int64_t ldkv;
  int64_t n;         // cells seen by row 0 (row t sees n + t)
  int64_t hd;
  float scale;
  float* o;          // row t, head j at o + t * ldo_t + j * ldo_h
  int64_t ldo_t, ldo_h;
  // Sparse attention (QSA, T = 1 only): the n attended cells are cells[0..n) (ascending) instead of 0..n-1;
  // cell i's key at k + cells[i] * ldkv. The result equals the dense kernel's on those cells gathered in order.
  const int32_t* cells = nullptr;
};

// Scratch: attend_scratch(a) floats.
inline int64_t attend_scratch(const AttendArgs& a) { return (int64_t)a.T * a.nh * (a.n + a.T + 16); }
void attend_ref(const AttendArgs& a, float* scratch);
// AVX-512 / AVX2 (kernels/cpu/attend_avx512.cpp, attend_avx2.cpp) for hd = 64, 128 or 256, else attend_ref.
// They run groups of queries through each block together (every key and value load shared by the group);
// one_query (tests and benches only) runs one query at a time instead: the same operations in the same
// order, so the same bits, only slower.
void attend_avx512(const AttendArgs& a, float* scratch, bool one_query = false);
void attend_avx2(const AttendArgs& a, float* scratch, bool one_query = false);
// The path of an Isa value (matmul.h).
void attend_on(int isa, const AttendArgs& a, float* scratch, bool one_query = false);
// The active ISA's path.
void attend(const AttendArgs& a, float* scratch);
// Benches only (bench/bench_history.py): every attend() call after this takes the one-query path (the same
// bits, slower), so that a bench can time the grouping inside a model, alternating in one process.
void attend_set_one_query(bool on);

}  // namespace strata
