// Shared by the int8-activation SIMD kernels (no intrinsics here): block sizes, the IQ sign-mask table.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>

#include "kernels/iq_tables.h"
#include "kernels/quants.h"
#include <immintrin.h>

#include "util/common.h"

namespace strata::kq {

// kSignMask[i] byte j = 0xFF where bit j of ksigns[i] is set: (g ^ m) - m negates exactly those bytes.
constexpr std::array<uint64_t, 128> make_sign_masks() {
  std::array<uint64_t, 128> t{};
  for (int i = 0; i < 128; i++)
    for (int j = 0; j < 8; j++)
      if ((kKsigns[i] >> j) & 1) t[i] |= (uint64_t)0xFF << (8 * j);
  return t;
}
alignas(64) inline constexpr std::array<uint64_t, 128> kSignMask = make_sign_masks();

// Q4_K/Q5_K scales and mins, branch-free (ggml's kmask trick): sc[0..7] and m[0..7] as bytes.
inline void k4_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  const uint32_t sc_lo = u[0] & k1, m_lo = u[1] & k1;
  const uint32_t sc_hi = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  std::memcpy(sc, &sc_lo, 4);
  std::memcpy(sc + 4, &sc_hi, 4);
  std::memcpy(m, &m_lo, 4);
  std::memcpy(m + 4, &m_hi, 4);
}

// Only for the ISA translation units (which are built with F16C): an fp16 scale.
inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
// The Q4_K/Q5_K block header: d, dmin, and the eight 6-bit scales and mins.
inline void k4_head(const uint8_t* b, float& d, float& dmin, uint8_t* sc, uint8_t* m) {
  d = h2f(b);
  dmin = h2f(b + 2);
  k4_scales(b + 4, sc, m);
}

}  // namespace strata::kq
