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

}  // namespace

RowsFn rows_fn_ref(uint32_t type) { return type_supported(type) && !int_act_type(type) ? rows_generic_ref : nullptr; }

}  // namespace strata
