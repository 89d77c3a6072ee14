// The portable 32-block activation quantizer (act32.h) and the buffers' sizing.
#include "kernels/act32.h"

#include <cmath>
#include <cstring>

namespace strata {

QAct32 QAct32Buf::view(int T, int64_t cols) {
  STRATA_CHECK(T >= 1 && T <= 8 && cols >= 32 && cols % 32 == 0, "quantize_act32: T = ", T, ", cols = ", cols,
               " (T in 1..8, cols a multiple of 32)");
  QAct32 a;
  a.T = T;
  a.cols = cols;
  a.nb = cols / 32;
  a.ldq = cols;
  if ((int64_t)q.size() < T * cols + 32) q.resize(T * cols + 32);
  if ((int64_t)d.size() < a.nb * 8) d.resize(a.nb * 8);
  std::memset(d.data(), 0, a.nb * 8 * sizeof(float));
  a.q = q.data();
  a.d = d.data();
  return a;
}

void quantize_act32_ref(const float* x, int64_t ldx, int T, int64_t cols, QAct32Buf& buf, QAct32& out) {
  out = buf.view(T, cols);
  for (int t = 0; t < T; t++)
    for (int64_t b = 0; b < out.nb; b++) {
      const float* xb = x + t * ldx + b * 32;
      int8_t* qb = buf.q.data() + t * out.ldq + b * 32;
      float amax = 0.f;
      for (int i = 0; i < 32; i++) amax = std::fmax(amax, std::fabs(xb[i]));
      const float iscale = amax > kAct32Tiny ? 127.f / amax : 0.f;
      for (int i = 0; i < 32; i++) qb[i] = (int8_t)std::nearbyint(iscale * xb[i]);
      buf.d[b * 8 + t] = amax / 127.f;
    }
}

}  // namespace strata
