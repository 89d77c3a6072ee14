// Matrix x T-row products over ggml-typed weights: y[t][r] = sum_c W[r][c] * x[t][c].
//
// Exactness contract (engine spec 2.5): the value of y[t][r] depends only on W's row r and x's row t,
// never on T, on the other rows, on the thread partition or on the ISA path chosen. Every path decodes
// a weight block once for all T rows and computes each row as its scalar `_ref` twin does, bit for bit
// (tests check this on fresh random inputs). What each type's path computes:
//
// F32, F16, BF16, Q8_0 (float activations): each weight is decoded
//   exactly as the type's scalar dequantizer does; 16 float lanes, lane j accumulates the products of columns
//   c = j (mod 16) with fused multiply-add in increasing c (a zero-padded tail), then the fixed tree
//   s8 = l[j]+l[j+8], s4 = s8[j]+s8[j+4], s2 = s4[j]+s4[j+2], y = s2[0]+s2[1].
//
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS (int8 activations,
//   quants.h): each activation row is quantized per
//   256-block to int8 (q, dx, sub-block sums bsum; a function of that row alone). A weight block in its
//   integer form (d, dmin, int16 w[256], mins m[8]) gives, per row, 16 exact int32 lane sums
//   P[k] = sum of w[v]*q[v] over the block's values v with (v mod 32) / 2 == k (vpmaddwd/vpdpwssd pairs)
//   and M = sum_j m[j]*bsum[j] (Q2_K: sum over its 16-value groups of m16[s] times their activation sum).
//   Per block, in increasing block order:
//     L[k] = fma(d*dx, (float)P[k], L[k])   and   Lm = fma(dmin*dx, (float)M, Lm)   (types with mins)
//   then y = reduce16(L) - Lm with the tree above. The result differs from the float64 product by the
//   activation rounding (|x - dx*q| <= dx/2 per value) plus float32 rounding of the 16-lane sums.
//
// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (int8 activations per 32 values, act32.h; llama.cpp's vec_dot_*_q8_0 /
//   _q8_1): each activation row is quantized per 32-block to int8 (q, dx; a function of that row alone). A weight
//   block is its scale s, min m (Q4_1, Q5_1) and 32 int8 values v (blocks32.h: weight = s * v + m). Per row and block
//   b, 4 exact int32 lane sums P[i] = sum of v[e]*q[e] over e in 4i..4i+3 and 16+4i..16+4i+3 (i = 0..3: the pairs
//   of a low and a high nibble byte's quads), and with a min the sums S[i] of q[e] over the same e, go to the
//   canonical lanes j = 4*(b % 4) + i, in increasing b:
//     L[j] = fma(s*dx, (float)P[i], L[j]),   then (min types) L[j] = fma(m*dx, (float)S[i], L[j])
//   (s*dx, m*dx: one float32 product each), then y = reduce16(L) with the tree above. The result differs from the
//   float64 product by the activation rounding (|x - dx*q| <= dx/2 per value, dx per 32 values) plus float32
//   rounding of the 16-lane sums.
#pragma once
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/act32.h"
#include "kernels/blocks32.h"
#include "kernels/quants.h"
#include "kernels/types.h"

namespace strata {

class ThreadPool;

// A 2-D view of a weight: `rows` rows of `cols` values, each row `row_bytes` bytes apart.
struct MatView {
  const uint8_t* data = nullptr;
  uint32_t type = GGML_F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
};

enum class Isa : int { Scalar = 0, AVX2 = 1, AVX512 = 2 };
Isa best_isa();             // what this CPU supports (at most the cap set by limit_isa)
Isa active_isa();           // what the kernels use now (best_isa() unless forced)
void force_isa(Isa isa);    // for tests and benches: pick a path; throws if the CPU lacks it
// Tests: behave as a CPU whose best path is min(detected, cap): best_isa(), the active path and the
// AVX-512 extensions (VNNI, VBMI) follow, so a whole suite runs as it would on an AVX2-only or scalar CPU.
void limit_isa(Isa cap);
const char* isa_name(Isa isa);

constexpr int kMaxRowsPerPass = 8;

// How a weight type's kernels read the activations: float rows, int8 rows per 256-block (quants.h: the K and IQ
// quants) or int8 rows per 32-block (act32.h: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4). Rows prepared for one type serve
// every type of the same kind.
enum class ActKind : int { Float = 0, Q8_256 = 1, Q8_32 = 2 };
inline ActKind act_kind(uint32_t type) {
  return int_act_type(type) ? ActKind::Q8_256 : act32_type(type) ? ActKind::Q8_32 : ActKind::Float;
}

// Up to kMaxRowsPerPass activation rows as a kernel reads them: the float rows, and for int8-activation
// types (int_act_type(W.type)) the same rows quantized (quants.h).
struct Act {
  const float* x = nullptr;
  int64_t ldx = 0;
  int T = 0;
  QAct q;      // q.q == nullptr unless prepared for a 256-block int8-activation type
  QAct32 q32;  // q32.q == nullptr unless prepared for a 32-block one
};
// Prepare rows for weight type `type` (quantizes when the type needs it, into buf). T in 1..kMaxRowsPerPass.
// many: the pass is one of several of one product (matmul_rows then takes the rows_many_fn panel kernel, which
// for some types reads the rows in another layout than the one-pass kernel).
Act prepare_act(uint32_t type, const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, bool many = false);

// Rows [r0, r1) of the product, on the calling thread. T in 1..kMaxRowsPerPass.
void matmul_range(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, int64_t r0,
                  int64_t r1);
// The same with rows prepared once by prepare_act (callers that split rows over threads themselves).
void matmul_range(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Any number of activation rows prepared once for one weight type: passes of at most kMaxRowsPerPass rows,
// each quantized when the type needs it (buffers are reused across calls and only grow).
struct ActRows {
  int T = 0;
  std::vector<Act> pass;
  std::vector<QActBuf> bufs;
  void prepare(uint32_t type, const float* x, int64_t ldx, int T, int64_t cols);
};
// Rows [r0, r1) of the product for every prepared row, on the calling thread. With several passes the weight
// rows go in tiles of about 32 KB, each tile through every pass while it stays in cache (pass after pass over
// all of [r0, r1) would stream W once per 8 activation rows). Each output element is the same kernel call on
// the same pass as in matmul_range, so the grouping changes no bits.
void matmul_rows(const MatView& W, const ActRows& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// The whole product, any T >= 1 (rows prepared once, passes of at most kMaxRowsPerPass activation rows),
// output rows split over the pool in one parallel region.
void matmul(ThreadPool& pool, const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy);

// Several products of the same input rows (e.g. q, k and v) in one parallel region per pass: each output
// element is the same kernel call as in matmul(), so results are identical; only the pool wake-ups are saved.
struct MatOut {
  const MatView* W;
  float* y;      // [T][ldy]
  int64_t ldy;
};
void matmul_many(ThreadPool& pool, const MatOut* outs, int n, const float* x, int64_t ldx, int T);

// Runtime T (1..kMaxRowsPerPass) -> a compile-time one, so that kernels keep their T accumulators in
// registers: call(std::integral_constant<int, T>{}).
template <class F>
inline void with_rows(int T, F&& call) {
  static_assert(kMaxRowsPerPass == 8, "with_rows lists the instances 1..8");
  switch (T) {
    case 1: return call(std::integral_constant<int, 1>{});
    case 2: return call(std::integral_constant<int, 2>{});
    case 3: return call(std::integral_constant<int, 3>{});
    case 4: return call(std::integral_constant<int, 4>{});
    case 5: return call(std::integral_constant<int, 5>{});
    case 6: return call(std::integral_constant<int, 6>{});
    case 7: return call(std::integral_constant<int, 7>{});
    default: return call(std::integral_constant<int, 8>{});
  }
}

// Kernel table entry: one function per (type, ISA). Declared here so per-ISA files can register.
using RowsFn = void (*)(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
RowsFn rows_fn(uint32_t type, Isa isa);  // nullptr if no kernel for that pair

// Per-ISA tables (defined in matmul_ref.cpp, cpu/matmul_avx2.cpp, cpu/matmul_avx512.cpp; the int8-activation
// kernels in kquants_ref.cpp, cpu/kquants_avx2.cpp, cpu/kquants_avx512.cpp).
RowsFn rows_fn_ref(uint32_t type);
RowsFn rows_fn_avx2(uint32_t type);
RowsFn rows_fn_avx512(uint32_t type);
RowsFn rows_fn_kq_ref(uint32_t type);
RowsFn rows_fn_kq_avx2(uint32_t type);
RowsFn rows_fn_kq8_avx2(uint32_t type);  // 8-bit weights x 8-bit activations for windows of <= 3 rows (AVX2)
RowsFn rows_fn_kq_avx512(uint32_t type);
RowsFn rows_fn_kq8_avx512(uint32_t type);  // Q4_K: 4-bit codes as bytes (vpmaddubsw), cpu/kquants8_avx512.cpp
RowsFn rows_fn_kq_avx512vbmi(uint32_t type);  // IQ2_XXS, IQ3_XXS with AVX-512 VBMI (cpu/kquants_avx512vbmi.cpp)
// Several passes of one prepared ActRows at once (pass p's output rows at y + p * kMaxRowsPerPass * ldy): each
// output element bit-identical to the RowsFn of the same type and ISA on that pass; nullptr where the type and
// ISA have none (matmul_rows then runs the RowsFn pass after pass).
using RowsManyFn = void (*)(const MatView& W, const Act* pass, int np, float* y, int64_t ldy, int64_t r0, int64_t r1);
RowsManyFn rows_many_fn(uint32_t type, Isa isa);
RowsManyFn rows_many_fn_kq_avx512(uint32_t type);
RowsManyFn rows_many_fn_kq8_avx512(uint32_t type);  // Q4_K (cpu/kquants8_avx512.cpp)
RowsManyFn rows_many_fn_kq_avx512vbmi(uint32_t type);
RowsManyFn rows_many_fn_kq_avx2(uint32_t type);   // prompt panels of the widening AVX2 kernel (cpu/kquants_avx2.cpp)
RowsManyFn rows_many_fn_kq8_avx2(uint32_t type);  // register-tiled 8-bit panels (cpu/kquants8_avx2.cpp)
bool cpu_has_avx512vnni();
bool cpu_has_avx512vbmi();
// Tests: with false, the AVX-512 path leaves out the VBMI kernels (the same results either way, tested).
void allow_vbmi(bool on);
// Tests: with false, the AVX-512 kernels take their paths for CPUs without VNNI (vpmaddwd + vpaddd for vpdpwssd;
// no VBMI kernels, which need VNNI): the same results either way, tested.
void allow_vnni(bool on);
// Tests: whether the AVX2 IQ kernels look up grid rows by vector gathers (default: on Intel cores) or by scalar
// loads (kq_common.h): the same results either way, tested.
void prefer_gathers(bool on);
bool gathers_preferred();
// Whether the AVX-512 path takes its VBMI kernels now (the CPU has VBMI and VNNI, and tests allow both).
bool vbmi_kernels_on();

// The canonical 16-lane reduction, shared by the scalar twins.
inline float reduce16(const float* l) {
  float s8[8], s4[4], s2[2];
  for (int j = 0; j < 8; j++) s8[j] = l[j] + l[j + 8];
  for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
  for (int j = 0; j < 2; j++) s2[j] = s4[j] + s4[j + 2];
  return s2[0] + s2[1];
}

}  // namespace strata
