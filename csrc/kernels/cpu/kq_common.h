// Shared by the int8-activation SIMD kernels (no intrinsics here): block sizes, the IQ sign-mask table.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>

#include "kernels/iq_tables.h"
#include "kernels/quants.h"
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

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}
inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void k4_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 8; j++) k4_scale_min(s, j, &sc[j], &m[j]);
}

}  // namespace strata::kq
