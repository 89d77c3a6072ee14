// Scalar twins of the row-product kernels: decode a row with the type's reference dequantizer, then
// accumulate in the canonical 16-lane order of matmul.h with std::fma. Slow and obviously right.
#include <cmath>
#include <vector>

#include "kernels/matmul.h"

namespace strata {

namespace {

void rows_generic_ref(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0,
                      int64_t r1) {
  const float* x = a.x;
  const int64_t ldx = a.ldx;
  const int T = a.T;
  const TypeTraits* tt = type_traits(W.type);
  const int64_t padded = (W.cols + 15) / 16 * 16;
  thread_local std::vector<float> w;
  w.assign(padded, 0.f);
  for (int64_t r = r0; r < r1; r++) {
    tt->dequant(W.data + r * W.row_bytes, w.data(), W.cols);
    for (int t = 0; t < T; t++) {
      const float* xt = x + t * ldx;
      float lanes[16] = {0};
      for (int64_t c = 0; c < padded; c += 16)
        for (int j = 0; j < 16; j++) {
          const float xv = c + j < W.cols ? xt[c + j] : 0.f;
          lanes[j] = std::fma(w[c + j], xv, lanes[j]);
        }
      y[t * ldy + r] = reduce16(lanes);
    }
  }
}

// The 32-value block types with int8 activations (matmul.h): the block's integer values, scale and min, per row
// the exact 4 lane sums of each block (values 4i..4i+3 and 16+4i..16+4i+3) into lanes 4*(b % 4) + i, one fma per
// lane and block (two with a min: the sums of q times m*dx).
void rows_b32q_ref(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int type_size = type_traits(W.type)->type_size;
  const bool has_min = act32_has_min(W.type);
  const int64_t nb = W.cols / 32;
  thread_local std::vector<int8_t> v;
  thread_local std::vector<float> s, mn;
  v.resize(nb * 32);
  s.resize(nb);
  mn.resize(nb);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    for (int64_t b = 0; b < nb; b++) s[b] = int_block32(W.type, row + b * type_size, v.data() + b * 32, &mn[b]);
    for (int t = 0; t < a.T; t++) {
      float L[16] = {0};
      for (int64_t b = 0; b < nb; b++) {
        const int8_t* q = a.q32.q + t * a.q32.ldq + b * 32;
        const int8_t* w = v.data() + b * 32;
        const float dx = a.q32.d[b * 8 + t], sd = s[b] * dx, md = mn[b] * dx;
        for (int i = 0; i < 4; i++) {
          int32_t P = 0, S = 0;
          for (int e = 4 * i; e < 4 * i + 4; e++) {
            P += (int32_t)w[e] * q[e] + (int32_t)w[16 + e] * q[16 + e];
            S += (int32_t)q[e] + q[16 + e];
          }
          float& l = L[4 * (b % 4) + i];
          l = std::fma(sd, (float)P, l);
          if (has_min) l = std::fma(md, (float)S, l);
        }
      }
      y[t * ldy + r] = reduce16(L);
    }
  }
}

}  // namespace

RowsFn rows_fn_ref(uint32_t type) {
  if (!type_supported(type) || int_act_type(type)) return nullptr;
  return act32_type(type) ? rows_b32q_ref : rows_generic_ref;
}

}  // namespace strata
