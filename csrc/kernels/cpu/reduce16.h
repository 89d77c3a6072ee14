// The canonical 16-lane reduction of matmul.h (reduce16: s8 = l[j]+l[j+8], s4, s2, then s2[0]+s2[1]) on
// SIMD registers, for the ISA the including file is compiled for. Internal linkage: the AVX2 and AVX-512
// files are built with different flags, and the linker must not pick one file's copy for the other.
#pragma once
#include <immintrin.h>

namespace strata {
namespace {

#if defined(__AVX2__)
// 16 lanes held as two 8-lane halves (lanes 0-7, 8-15)
inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#endif

#if defined(__AVX512F__)
inline float reduce16(__m512 v) { return reduce16(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }
#endif

}  // namespace
}  // namespace strata
