// The device twin of rowops_impl.h's exp_inl: the same clamps, the same Cody-Waite reduction and polynomial, the
// same exponent-bit construction, every step a correctly rounded float32 operation (__fmul_rn / __fadd_rn, no
// contraction), so exp_inl_dev(x) == exp_inl(x) bit for bit for every float x, NaN included.
#pragma once
#include <cstdint>

namespace strata::cuda {

__device__ __forceinline__ float exp_inl_dev(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.f ? 88.f : x;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.f), 12582912.f);
  float r = __fsub_rn(x, __fmul_rn(n, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(p, __fmul_rn(r, r)), r), 1.f);
  const float e = __fadd_rn(n, 12583039.f);
  const uint32_t bits = (__float_as_uint(e) - 0x4B400000u) << 23;
  return __fmul_rn(p, __uint_as_float(bits));
}

// rowops silu: z / (1 + exp_inl(-z))
__device__ __forceinline__ float silu_of(float z) { return __fdiv_rn(z, __fadd_rn(1.f, exp_inl_dev(-z))); }
__device__ __forceinline__ float sigmoid_of(float g) { return __fdiv_rn(1.f, __fadd_rn(1.f, exp_inl_dev(-g))); }
// the gated norm's value (rowops rmsnorm, then mul_silu / mul_sigmoid): (x * r) * w, times silu(z) or sigmoid(z)
__device__ __forceinline__ float gated_value(float x, float r, float w, float z, bool sig) {
  return __fmul_rn(__fmul_rn(__fmul_rn(x, r), w), sig ? sigmoid_of(z) : silu_of(z));
}

}  // namespace strata::cuda
