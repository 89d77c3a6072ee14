// The device twins of glibc's expf and log1pf (csrc/kernels/cuda/libm_inl.cuh), emulated on the host with the same
// operations (std::fma where the device port fuses), against this machine's libm over all 2^32 float inputs:
//   g++ -O2 -ffp-contract=off -std=c++17 -pthread tools/libm_twins_check.cpp -o /tmp/libm_check
//   /tmp/libm_check 0 3   # expf, the FMA build's fusions (variant 3: what libm_inl.cuh does); prints mismatches
//   /tmp/libm_check 1     # log1pf (float operations, no fusion)
// glibc 2.36 on x86-64 with FMA (2026-12-01): 0 mismatches each. Variant 0 (no fusion: the SSE2 build) is what a CPU
// without FMA runs; a mismatch there says the device twin would need that build's operations instead.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
static inline uint32_t fb(float x){uint32_t u;memcpy(&u,&x,4);return u;}
static inline float bf(uint32_t u){float x;memcpy(&x,&u,4);return x;}
static inline uint64_t db(double x){uint64_t u;memcpy(&u,&x,8);return u;}
static inline double bd(uint64_t u){double x;memcpy(&x,&u,8);return x;}
static uint64_t TAB[32];
static int VAR = 0;
float p_expf(float x) {
  const double N = 32.0, InvLn2N = 0x1.71547652b82fep+0 * N, SHIFT = 0x1.8p+52;
  const double C0 = 0x1.c6af84b912394p-5 / N / N / N, C1 = 0x1.ebfce50fac4f3p-3 / N / N, C2 = 0x1.62e42ff0c52d6p-1 / N;
  uint32_t abstop = (fb(x) >> 20) & 0x7ff;
  if (abstop >= ((fb(88.0f) >> 20) & 0x7ff)) {
    if (fb(x) == fb(-INFINITY)) return 0.0f;
    if (abstop >= ((fb(INFINITY) >> 20) & 0x7ff)) return x + x;
    if (x > 0x1.62e42ep6f) return INFINITY;
    if (x < -0x1.9fe368p6f) return 0.0f;
  }
  double xd = x, z, kd, r, y, zz, r2;
  uint64_t ki;
  if (VAR & 1) { kd = std::fma(InvLn2N, xd, SHIFT); ki = db(kd); kd -= SHIFT; r = std::fma(InvLn2N, xd, -kd); }
  else { z = InvLn2N * xd; kd = z + SHIFT; ki = db(kd); kd -= SHIFT; r = z - kd; }
  uint64_t t = TAB[ki % 32] + (ki << 47);
  double s = bd(t);
  if (VAR & 2) { zz = std::fma(C0, r, C1); r2 = r * r; y = std::fma(C2, r, 1.0); y = std::fma(zz, r2, y); }
  else { zz = C0 * r + C1; r2 = r * r; y = C2 * r + 1.0; y = zz * r2 + y; }
  return (float)(y * s);
}
float p_log1pf(float x) {  // glibc sysdeps/ieee754/flt-32/s_log1pf.c, float ops, no contraction
  const float ln2_hi = 6.9313812256e-01f, ln2_lo = 9.0580006145e-06f, two25 = 3.355443200e+07f;
  const float Lp1 = 6.6666668653e-01f, Lp2 = 4.0000000596e-01f, Lp3 = 2.8571429849e-01f, Lp4 = 2.2222198546e-01f,
              Lp5 = 1.8183572590e-01f, Lp6 = 1.5313838422e-01f, Lp7 = 1.4798198640e-01f;
  float hfsq, f = 0, c = 0, s, z, R, u;
  int32_t k, hx, hu = 0, ax;
  hx = (int32_t)fb(x); ax = hx & 0x7fffffff; k = 1;
  if (hx < 0x3ed413d7) {
    if (ax >= 0x3f800000) { if (x == -1.0f) return -INFINITY; return NAN; }
    if (ax < 0x31000000) { if (ax < 0x24800000) return x; return x - x * x * 0.5f; }
    if (hx > 0 || hx <= (int32_t)0xbe95f61f) { k = 0; f = x; hu = 1; }
  }
  if (hx >= 0x7f800000) return x + x;
  if (k != 0) {
    if (hx < 0x5a000000) { u = 1.0f + x; hu = (int32_t)fb(u); k = (hu >> 23) - 127; c = (k > 0) ? 1.0f - (u - x) : x - (u - 1.0f); c /= u; }
    else { u = x; hu = (int32_t)fb(u); k = (hu >> 23) - 127; c = 0; }
    hu &= 0x007fffff;
    if (hu < 0x3504f7) { u = bf((uint32_t)(hu | 0x3f800000)); }
    else { k += 1; u = bf((uint32_t)(hu | 0x3f000000)); hu = (0x00800000 - hu) >> 2; }
    f = u - 1.0f;
  }
  hfsq = 0.5f * f * f;
  if (hu == 0) {
    if (f == 0.0f) { if (k == 0) return 0.0f; c += k * ln2_lo; return k * ln2_hi + c; }
    R = hfsq * (1.0f - 0.66666666666666666f * f);
    if (k == 0) return f - R;
    return k * ln2_hi - ((R - (k * ln2_lo + c)) - f);
  }
  s = f / (2.0f + f);
  z = s * s;
  R = z * (Lp1 + z * (Lp2 + z * (Lp3 + z * (Lp4 + z * (Lp5 + z * (Lp6 + z * Lp7))))));
  if (k == 0) return f - (hfsq - s * (hfsq + R));
  return k * ln2_hi - ((hfsq - (s * (hfsq + R) + (k * ln2_lo + c))) - f);
}
int main(int argc, char** argv) {
  for (int i = 0; i < 32; i++) TAB[i] = db(std::exp2(i / 32.0)) - ((uint64_t)i << 47);
  int which = atoi(argv[1]); VAR = argc > 2 ? atoi(argv[2]) : 0;
  uint64_t mism[2] = {0, 0};
  auto work = [&](int t) {
    for (uint64_t i = t; i < (1ull << 32); i += 2) {
      float x = bf((uint32_t)i);
      float a = which == 0 ? expf(x) : log1pf(x), b = which == 0 ? p_expf(x) : p_log1pf(x);
      if (fb(a) != fb(b) && !(std::isnan(a) && std::isnan(b))) { if (!mism[t]) printf("x=%a libm=%a port=%a\n", x, a, b); mism[t]++; }
    }
  };
  std::thread t1(work, 1); work(0); t1.join();
  printf("which %d var %d mismatches %llu\n", which, VAR, (unsigned long long)(mism[0] + mism[1]));
}
