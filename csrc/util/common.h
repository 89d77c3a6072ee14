// Small shared helpers: error formatting, half/bfloat16 conversion, aligned buffers.
#pragma once
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata {

// Build a message from pieces: fail<std::invalid_argument>("tensor ", name, ": expected ", a, " got ", b).
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}
template <class E = std::runtime_error, class... A>
[[noreturn]] void fail(const A&... a) {
  throw E(cat(a...));
}
#define STRATA_CHECK(cond, ...) \
  do { if (!(cond)) ::strata::fail<std::invalid_argument>(__VA_ARGS__); } while (0)

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) { mant <<= 1; exp--; }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Unaligned little-endian loads from block data.
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

// 64-byte aligned float buffer (AVX-512 friendly), zero-initialised.
struct FBuf {
  std::vector<float> v;
  float* p = nullptr;
  size_t n = 0;
  void resize(size_t count) {
    if (count <= n) return;
    v.assign(count + 16, 0.f);
    uintptr_t a = reinterpret_cast<uintptr_t>(v.data());
    p = reinterpret_cast<float*>((a + 63) & ~uintptr_t(63));
    n = count;
  }
  float* data() { return p; }
  float& operator[](size_t i) { return p[i]; }
};

}  // namespace strata

#include <chrono>
namespace strata {
struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};
}  // namespace strata
