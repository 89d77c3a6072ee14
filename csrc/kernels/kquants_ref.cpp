// Scalar twins of the int8-activation kernels (K and IQ quants): decode each block to its integer form,
// then per activation row the exact lane sums and float accumulation that matmul.h states.
#include <cmath>
#include <vector>

#include "kernels/matmul.h"

namespace strata {

namespace {

void rows_kq_ref(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const IntDecodeFn decode = int_decoder(W.type);
  const int type_size = type_traits(W.type)->type_size;
  const int64_t nb = W.cols / QK_K;
  thread_local std::vector<IntBlock> blocks;
  blocks.resize(nb);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    for (int64_t b = 0; b < nb; b++) decode(row + b * type_size, blocks[b]);
    for (int t = 0; t < a.T; t++) {
      float L[16] = {0}, Lm = 0.f;
      for (int64_t b = 0; b < nb; b++) {
        const IntBlock& B = blocks[b];
        const int16_t* q = a.q.q + t * a.q.ldq + b * QK_K;
        const float dx = a.q.d[b * 8 + t];
        int32_t P[16] = {0};
        for (int v = 0; v < QK_K; v++) P[(v % 32) / 2] += (int32_t)B.w[v] * q[v];
        const float dd = B.d * dx;
        for (int k = 0; k < 16; k++) L[k] = std::fma(dd, (float)P[k], L[k]);
        if (B.has_min) {
          int32_t M = 0;
          if (B.min16)  // mins per 16 values (Q2_K): the same integer sum_v m(v) q[v], over the values themselves
            for (int v = 0; v < QK_K; v++) M += (int32_t)B.m16[v / 16] * q[v];
          else
            for (int j = 0; j < 8; j++) M += (int32_t)B.m[j] * a.q.bsum[(b * 4 + j / 2) * 16 + 2 * t + (j & 1)];
          Lm = std::fma(B.dmin * dx, (float)M, Lm);
        }
      }
      y[t * ldy + r] = reduce16(L) - Lm;
    }
  }
}

}  // namespace

RowsFn rows_fn_kq_ref(uint32_t type) { return int_act_type(type) ? rows_kq_ref : nullptr; }

}  // namespace strata
