// Elementwise and per-row operations of the Qwen3-Next graph, in float32, in the operation order of the
// transformers reference.
#pragma once
#include <cmath>
#include <cstdint>

namespace strata {

// sum_i a[i] * b[i] in 16 lanes (lane i % 16, increasing i) and a fixed tree: the compiler vectorises it
// without reassociating anything, and the value depends only on a and b.
inline float dot16(const float* a, const float* b, int64_t n) {
  float l[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) l[j] = l[j] + a[i + j] * b[i + j];
  for (; i < n; i++) l[i & 15] = l[i & 15] + a[i] * b[i];
  float s8[8], s4[4];
  for (int j = 0; j < 8; j++) s8[j] = l[j] + l[j + 8];
  for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
// y = (x * rsqrt(mean(x^2) + eps)) * w   (GGUF norms already carry the +1 of the zero-centred form); the sum
// of squares in dot16's 16 lanes (vectorised, and far less rounding error than one running sum)
inline void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float ss = dot16(x, x, n);
  const float r = 1.f / std::sqrt(ss / (float)n + eps);
  for (int64_t i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20
// x * rsqrt(sum(x^2) + eps), the l2norm of the HF / FLA delta rule
inline void l2norm(float* x, int64_t n, float eps) {
  const float ss = dot16(x, x, n);
  const float r = 1.f / std::sqrt(ss + eps);
  for (int64_t i = 0; i < n; i++) x[i] = x[i] * r;
}
// NeoX rotation of the first n_rot dims of a head at position pos: pairs (i, i + n_rot/2) rotated by
// pos * theta^(-2i/n_rot). rope_angles fills cos/sin (n_rot/2 each) once per position for every head.
inline void rope_angles(int64_t n_rot, int64_t pos, float theta, float* cs, float* sn) {
  for (int64_t i = 0; i < n_rot / 2; i++) {
    const float inv_freq = (float)(1.0 / std::pow((double)theta, (double)(2 * i) / (double)n_rot));
    const float ang = (float)pos * inv_freq;
    cs[i] = (float)std::cos((double)ang);
    sn[i] = (float)std::sin((double)ang);
  }
}
inline void rope_neox(float* x, int64_t n_rot, const float* cs, const float* sn) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; i++) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cs[i] - b * sn[i];
    x[i + half] = b * cs[i] + a * sn[i];
  }
}

}  // namespace strata
