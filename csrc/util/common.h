// Small shared helpers: error formatting, half/bfloat16 conversion, aligned buffers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
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

// An allocator on 64-byte boundaries, for buffers the kernels load in 64-byte vectors (on malloc's 16-byte
// alignment every such load of a row would split over two cache lines).
template <class T>
struct Align64 {
  using value_type = T;
  Align64() = default;
  template <class U>
  Align64(const Align64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const Align64<U>&) const { return true; }
};

// 64-byte aligned float buffer (AVX-512 friendly) that only grows, zero-initialised when it does.
struct FBuf {
  std::vector<float, Align64<float>> v;
  void resize(size_t count) {
    if (count > v.size()) v.assign(count, 0.f);
  }
  float* data() { return v.data(); }
  float& operator[](size_t i) { return v[i]; }
};

}  // namespace strata

#include <chrono>
namespace strata {
struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};
}  // namespace strata
