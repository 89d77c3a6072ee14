// Hyper-connections (qwen4exp.md 1.3): hc residual streams X [hc][H] per token, in place of the layer norms.
//   xn = grouped ZC-RMSNorm(X; norm)                      (each stream's H values, its own weights)
//   u  = silu((down . xn) / hc)            [R]            G = sigmoid(up . u)   [hc][H]
//   m  = (1/hc) sum_j G_j * xn_j           [H]            the block's input
//   a  = 2 * sigmoid((inject . xn) / hc)   [hc]           after the block: X_j += a_j * y
// The head mixer is steps 1-4 (no inject); nothing else touches the streams.
#include <cmath>

#include "kernels/rowops.h"
#include "model/layers.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

void hc_mix(const Model& m, const HcWeights& w, const float* X, int T, float* mixed, float* scales) {
  const HParams& hp = m.hp();
  const int64_t H = hp.n_embd, hc = hp.hc, W = hc * H, R = hp.hc_rank;
  STRATA_CHECK(T >= 1 && hc >= 2 && w.down.rows == R && w.down.cols == W && w.up.rows == W && w.up.cols == R,
               "hyper-connections: weight shapes do not fit (hc ", hc, ", H ", H, ", rank ", R, ")");
  STRATA_CHECK(!scales || (w.inject.data && w.inject.rows == hc), "hyper-connections: no inject weight");
  thread_local FBuf xn, d, g, a;
  xn.resize((size_t)T * W);  // [T][hc][H]
  d.resize((size_t)T * R);   // [T][R]
  g.resize((size_t)T * W);   // [T][hc][H]
  a.resize((size_t)T * hc);  // [T][hc]
  for (int t = 0; t < T; t++)
    for (int64_t j = 0; j < hc; j++)
      rmsnorm(X + (size_t)t * W + j * H, w.norm.data() + j * H, H, hp.rms_eps, xn.data() + (size_t)t * W + j * H);
  ThreadPool& pool = m.pool();
  if (scales) {
    const MatOut outs[2] = {{&w.down, d.data(), R}, {&w.inject, a.data(), hc}};
    matmul_many(pool, outs, 2, xn.data(), W, T);
  } else {
    matmul(pool, w.down, xn.data(), W, T, d.data(), R);
  }
  const float fhc = (float)hc;
  for (int64_t i = 0; i < (int64_t)T * R; i++) d[i] = d[i] / fhc;
  silu_inplace(d.data(), (int64_t)T * R);
  matmul(pool, w.up, d.data(), R, T, g.data(), W);
  mul_sigmoid(xn.data(), g.data(), (int64_t)T * W);  // xn <- G * xn (xn is not needed after the products)
  for (int t = 0; t < T; t++) {
    const float* xt = xn.data() + (size_t)t * W;
    float* mt = mixed + (size_t)t * H;
    for (int64_t i = 0; i < H; i++) mt[i] = xt[i];
    for (int64_t j = 1; j < hc; j++)
      for (int64_t i = 0; i < H; i++) mt[i] = mt[i] + xt[j * H + i];
    for (int64_t i = 0; i < H; i++) mt[i] = mt[i] / fhc;
    if (scales)
      for (int64_t j = 0; j < hc; j++) scales[t * hc + j] = 2.f * sigmoid(a[t * hc + j] / fhc);
  }
}

void hc_inject(const Model& m, float* X, const float* y, const float* scales, int T) {
  const int64_t H = m.hp().n_embd, hc = m.hp().hc, W = hc * H;
  for (int t = 0; t < T; t++)
    for (int64_t j = 0; j < hc; j++) {
      float* x = X + (size_t)t * W + j * H;
      const float* yt = y + (size_t)t * H;
      const float a = scales[t * hc + j];
      for (int64_t i = 0; i < H; i++) x[i] = x[i] + yt[i] * a;
    }
}

}  // namespace strata
