// The row loops of rowops.h, compiled once per ISA (internal linkage: the builds cannot be mixed at link
// time). Plain loops the compiler vectorises; every element goes through the same operations in the same
// order whatever the vector width, so every build gives the same bits.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/rowops.h"

namespace strata {
namespace {

inline float exp_inl(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.f ? 88.f : x;
  // n = round-to-nearest(x / ln 2) by the 1.5 * 2^23 trick (exact, vectorises on any ISA)
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  float r = x - n * 0.693359375f;  // ln 2 = 0.693359375 - 2.12194440e-4, first part exact in n * C1
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  // 2^n, n in [-126, 127]: a normal float. The exponent bits come from n + 127 + 1.5 * 2^23 (exact), whose
  // low mantissa bits are n + 127: no float-to-int conversion, so a NaN input (NaN weights) is not UB.
  const float e = n + 12583039.f;
  uint32_t bits;
  std::memcpy(&bits, &e, 4);
  bits = (bits - 0x4B400000u) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

void silu_inplace_impl(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.f + exp_inl(-x[i]));
}
void silu_mul_impl(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; i++) g[i] = (g[i] / (1.f + exp_inl(-g[i]))) * u[i];
}
void mul_silu_impl(float* y, const float* z, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = y[i] * (z[i] / (1.f + exp_inl(-z[i])));
}
void mul_sigmoid_impl(float* o, const float* g, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = o[i] * (1.f / (1.f + exp_inl(-g[i])));
}
void exp_shift_impl(float* x, float m, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = exp_inl(x[i] - m);
}
void axpy_impl(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = y[i] + a * x[i];
}
void causal_conv_silu_impl(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out) {
  for (int t = 0; t < T; t++) {
    float* o = out + (int64_t)t * ld;
    for (int64_t c = 0; c < n; c++) o[c] = 0.f;
    for (int j = 0; j < K; j++) {
      const float* h = hist + (int64_t)(t + j) * ld;
      const float* w = w_t + (int64_t)j * ld;
      for (int64_t c = 0; c < n; c++) o[c] = o[c] + w[c] * h[c];
    }
    silu_inplace_impl(o, n);
  }
}

constexpr RowOps kRowOps{silu_inplace_impl, silu_mul_impl, mul_silu_impl, mul_sigmoid_impl, exp_shift_impl,
                         axpy_impl, causal_conv_silu_impl};

}  // namespace
}  // namespace strata
