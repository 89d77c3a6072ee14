// AVX-512 row-product kernels (compiled with -mavx512*; chosen at run time). Each weight row is decoded
// once per pass and multiplied into all T activation rows; per row the order is the canonical one of
// matmul.h, so results are bit-identical to matmul_ref.cpp and independent of T.
#include <immintrin.h>

#include <cstring>

#include "kernels/matmul.h"

namespace strata {

namespace {

inline float reduce16_avx512(__m512 v) {
  // canonical tree: s8[j] = l[j] + l[j+8]; s4[j] = s8[j] + s8[j+4]; s2[j] = s4[j] + s4[j+2]; s2[0] + s2[1]
  __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// Decoders: produce 16 weights starting at column c of a row.
struct DecF32 {
  static __m512 load(const uint8_t* row, int64_t c) { return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c); }
  static __m512 load_tail(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + c);
  }
};
struct DecF16 {
  static __m512 load(const uint8_t* row, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
  }
  static __m512 load_tail(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * c));
  }
};
struct DecBF16 {
  static __m512 load(const uint8_t* row, int64_t c) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load_tail(const uint8_t* row, int64_t c, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * c);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

template <class Dec>
void rows_plain(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const float* x = a.x;
  const int64_t ldx = a.ldx;
  const int T = a.T;
  const int64_t full = W.cols / 16 * 16;
  const int rem = (int)(W.cols - full);
  const __mmask16 m = (__mmask16)((1u << rem) - 1);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m512 acc[kMaxRowsPerPass];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 w = Dec::load(row, c);
      for (int t = 0; t < T; t++) acc[t] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + t * ldx + c), acc[t]);
    }
    if (rem) {
      const __m512 w = Dec::load_tail(row, full, m);
      for (int t = 0; t < T; t++) acc[t] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x + t * ldx + full), acc[t]);
    }
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16_avx512(acc[t]);
  }
}

// Q8_0: block of 32 = half d + 32 int8; w = d * (float)q, the same product the scalar dequantizer forms.
void rows_q8_0(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const float* x = a.x;
  const int64_t ldx = a.ldx;
  const int T = a.T;
  const int64_t nb = W.cols / 32;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m512 acc[kMaxRowsPerPass];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* blk = row + b * 34;
      uint16_t h;
      std::memcpy(&h, blk, 2);
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
      const __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 2)))));
      const __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 18)))));
      const float* xb = x + b * 32;
      for (int t = 0; t < T; t++) {
        acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb + t * ldx), acc[t]);
        acc[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + t * ldx + 16), acc[t]);
      }
    }
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16_avx512(acc[t]);
  }
}

}  // namespace

RowsFn rows_fn_avx512(uint32_t type) {
  switch (type) {
    case GGML_F32: return rows_plain<DecF32>;
    case GGML_F16: return rows_plain<DecF16>;
    case GGML_BF16: return rows_plain<DecBF16>;
    case GGML_Q8_0: return rows_q8_0;
    default: return nullptr;
  }
}

}  // namespace strata
