// The device twins of the libm calls in the CPU model's gates (ops.h sigmoid / softplus, deltanet.cpp's exp(g),
// moe.cpp's shared-expert gate): glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, the __expf_fma build x86-64 glibc
// selects on a CPU with FMA: its products fused as that build fuses them) and log1pf (s_log1pf.c, float operations,
// no contraction). Checked against glibc 2.36 on x86-64 over all 2^32 float inputs, 0 differences each
// (tests/test_cuda_forward.py: dn_gates and moe_combine on wide-range inputs equal the CPU backend's, which calls
// the host's libm).
#pragma once
#include <cstdint>

namespace strata::cuda {

// 2^(i/32) as double bits, minus i << 47 (e_expf's table: the exponent of 2^(k/32) is added back from k).
static __constant__ uint64_t kExp2fTab[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull};

__device__ __forceinline__ float expf_glibc(float x) {
  const double N = 32.0, InvLn2N = 0x1.71547652b82fep+0 * N, SHIFT = 0x1.8p+52;
  const double C0 = 0x1.c6af84b912394p-5 / N / N / N, C1 = 0x1.ebfce50fac4f3p-3 / N / N, C2 = 0x1.62e42ff0c52d6p-1 / N;
  const uint32_t ux = __float_as_uint(x), abstop = (ux >> 20) & 0x7ff;
  if (abstop >= ((0x42b00000u >> 20) & 0x7ff)) {  // |x| >= 88 or NaN
    if (ux == 0xff800000u) return 0.f;            // -inf
    if (abstop >= 0x7f8) return x + x;            // inf, NaN
    if (x > 0x1.62e42ep6f) return __int_as_float(0x7f800000);  // overflow
    if (x < -0x1.9fe368p6f) return 0.f;                         // underflow
  }
  const double xd = (double)x;
  double kd = __fma_rn(InvLn2N, xd, SHIFT);  // round(x * N / ln 2) by the shift
  const uint64_t ki = (uint64_t)__double_as_longlong(kd);
  kd = __dsub_rn(kd, SHIFT);
  const double r = __fma_rn(InvLn2N, xd, -kd);
  const uint64_t t = kExp2fTab[ki % 32] + (ki << 47);
  const double s = __longlong_as_double((long long)t);
  const double z = __fma_rn(C0, r, C1), r2 = __dmul_rn(r, r);
  double y = __fma_rn(C2, r, 1.0);
  y = __fma_rn(z, r2, y);
  return (float)__dmul_rn(y, s);
}

__device__ __forceinline__ float log1pf_glibc(float x) {
  const float ln2_hi = 6.9313812256e-01f, ln2_lo = 9.0580006145e-06f;
  const float Lp1 = 6.6666668653e-01f, Lp2 = 4.0000000596e-01f, Lp3 = 2.8571429849e-01f, Lp4 = 2.2222198546e-01f,
              Lp5 = 1.8183572590e-01f, Lp6 = 1.5313838422e-01f, Lp7 = 1.4798198640e-01f;
  float hfsq, f = 0.f, c = 0.f, s, z, R, u;
  int32_t k = 1, hu = 0;
  const int32_t hx = (int32_t)__float_as_uint(x), ax = hx & 0x7fffffff;
  if (hx < 0x3ed413d7) {
    if (ax >= 0x3f800000) return x == -1.f ? __int_as_float(0xff800000) : __int_as_float(0x7fc00000);
    if (ax < 0x31000000) return ax < 0x24800000 ? x : __fsub_rn(x, __fmul_rn(__fmul_rn(x, x), 0.5f));
    if (hx > 0 || hx <= (int32_t)0xbe95f61f) { k = 0; f = x; hu = 1; }
  }
  if (hx >= 0x7f800000) return x + x;
  if (k != 0) {
    if (hx < 0x5a000000) {
      u = __fadd_rn(1.f, x);
      hu = (int32_t)__float_as_uint(u);
      k = (hu >> 23) - 127;
      c = k > 0 ? __fsub_rn(1.f, __fsub_rn(u, x)) : __fsub_rn(x, __fsub_rn(u, 1.f));
      c = __fdiv_rn(c, u);
    } else {
      u = x;
      hu = (int32_t)__float_as_uint(u);
      k = (hu >> 23) - 127;
      c = 0.f;
    }
    hu &= 0x007fffff;
    if (hu < 0x3504f7) {
      u = __uint_as_float((uint32_t)(hu | 0x3f800000));
    } else {
      k += 1;
      u = __uint_as_float((uint32_t)(hu | 0x3f000000));
      hu = (0x00800000 - hu) >> 2;
    }
    f = __fsub_rn(u, 1.f);
  }
  hfsq = __fmul_rn(__fmul_rn(0.5f, f), f);
  const float kf = (float)k;
  if (hu == 0) {
    if (f == 0.f) {
      if (k == 0) return 0.f;
      c = __fadd_rn(c, __fmul_rn(kf, ln2_lo));
      return __fadd_rn(__fmul_rn(kf, ln2_hi), c);
    }
    R = __fmul_rn(hfsq, __fsub_rn(1.f, __fmul_rn(0.66666666666666666f, f)));
    if (k == 0) return __fsub_rn(f, R);
    return __fsub_rn(__fmul_rn(kf, ln2_hi), __fsub_rn(__fsub_rn(R, __fadd_rn(__fmul_rn(kf, ln2_lo), c)), f));
  }
  s = __fdiv_rn(f, __fadd_rn(2.f, f));
  z = __fmul_rn(s, s);
  float p = __fadd_rn(Lp6, __fmul_rn(z, Lp7));
  p = __fadd_rn(Lp5, __fmul_rn(z, p));
  p = __fadd_rn(Lp4, __fmul_rn(z, p));
  p = __fadd_rn(Lp3, __fmul_rn(z, p));
  p = __fadd_rn(Lp2, __fmul_rn(z, p));
  p = __fadd_rn(Lp1, __fmul_rn(z, p));
  R = __fmul_rn(z, p);
  if (k == 0) return __fsub_rn(f, __fsub_rn(hfsq, __fmul_rn(s, __fadd_rn(hfsq, R))));
  return __fsub_rn(__fmul_rn(kf, ln2_hi),
                   __fsub_rn(__fsub_rn(hfsq, __fadd_rn(__fmul_rn(s, __fadd_rn(hfsq, R)), __fadd_rn(__fmul_rn(kf, ln2_lo), c))), f));
}

// ops.h: sigmoid(x) = 1 / (1 + exp(-x)); softplus(x) = x > 20 ? x : log1p(exp(x)).
__device__ __forceinline__ float sigmoid_libm(float x) { return __fdiv_rn(1.f, __fadd_rn(1.f, expf_glibc(-x))); }
__device__ __forceinline__ float softplus_libm(float x) { return x > 20.f ? x : log1pf_glibc(expf_glibc(x)); }

}  // namespace strata::cuda
