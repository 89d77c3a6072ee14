// Activation rows quantized per 32 values (llama.cpp's Q8_0 activations), for the 32-value block types that
// multiply int8 activations: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 (blocks32.h, contract in matmul.h). Per row t and
// 32-value block b (deterministic, a function of that row alone; the same formula as quants.h's 256-blocks):
//   amax = max|x|, iscale = amax > 2^-100 ? 127/amax : 0, q = round_half_even(iscale*x) in [-127, 127], dx = amax/127
// (a block whose values are all below 2^-100 in magnitude gives q = 0: 127/amax would overflow near 1e-37, and
// 0 * inf is NaN; the error, < 2^-100 per value, is far below the rounding of any other block).
// 32-blocks rather than quants.h's 256-blocks: rows of these types need only cols % 32 == 0 (llama.cpp falls back
// to IQ4_NL / Q5_0 exactly for rows that 256-blocks cannot split), and the rounding error follows the local amax.
#pragma once
#include <cstdint>
#include <vector>

#include "util/common.h"  // Align64

namespace strata {

constexpr float kAct32Tiny = 0x1p-100f;  // amax at or below it: q = 0

// T <= 8 rows, cols % 32 == 0.
//   q[t*ldq + c]   int8 values (ldq = cols, 32 bytes of padding after the last row)
//   d[b*8 + t]     dx of block b of row t (rows >= T are 0)
// The SIMD kernels' layout (cpu/b32q_impl.h; the AVX2 quantizer only, null from the portable one): blocks in
// pairs m = (2m, 2m+1), np = ceil(nb / 2) pairs a row (an odd last block's partner: q = 0, dx = 0):
//   qp[(t*np + m)*64 + ...]  the pair's q: [2m: q0..15][2m+1: q0..15][2m: q16..31][2m+1: q16..31]
//   cq[(t*np + m)*8 + j]     16 * the lane sums of q (lane j: block 2m + j/4, values 4i..4i+3, 16+4i..16+4i+3,
//                            i = j % 4): the correction of the kernels' unsigned weights v + 16
//   dp[(t*np + m)*8 + j]     dx of block 2m + j/4
//   sq[(t*np + m)*8 + j]     the lane sums of q as floats (exact), the min term's factor (Q4_1, Q5_1)
struct QAct32 {
  int T = 0;
  int64_t cols = 0, nb = 0, ldq = 0, np = 0;
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int8_t* qp = nullptr;
  const int32_t* cq = nullptr;
  const float* dp = nullptr;
  const float* sq = nullptr;
};
struct QAct32Buf {
  std::vector<int8_t, Align64<int8_t>> q, qp;
  std::vector<int32_t, Align64<int32_t>> cq;
  std::vector<float, Align64<float>> d, dp, sq;
  QAct32 view(int T, int64_t cols);  // sizes the buffers, returns a view to fill
};
using Quantize32Fn = void (*)(const float* x, int64_t ldx, int T, int64_t cols, QAct32Buf& buf, QAct32& out);
// The portable quantizer and the AVX2 one (also used by the AVX-512 path): identical bytes (tested).
void quantize_act32_ref(const float* x, int64_t ldx, int T, int64_t cols, QAct32Buf& buf, QAct32& out);
void quantize_act32_avx2(const float* x, int64_t ldx, int T, int64_t cols, QAct32Buf& buf, QAct32& out);

}  // namespace strata
