// AVX2 + FMA row-product kernels: the 16 canonical lanes live in two 8-wide registers (lanes 0-7, 8-15),
// so per row the arithmetic is the canonical order of matmul.h, bit-identical to the scalar twins.
#include <immintrin.h>

#include <cstring>

#include "kernels/blocks32.h"
#include "kernels/cpu/b32q_impl.h"
#include "kernels/cpu/kq_common.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"

namespace strata {

namespace {

// 8 weights at column c (c % 8 == 0, c + 8 <= cols).
struct DecF32 {
  static __m256 load(const uint8_t* row, int64_t c) { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c); }
};
struct DecF16 {
  static __m256 load(const uint8_t* row, int64_t c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  }
};
struct DecBF16 {
  static __m256 load(const uint8_t* row, int64_t c) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// T is a compile-time constant (the accumulators stay in registers); per output element nothing changes.
template <class Dec, int T>
void rows_plain_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const float* x = a.x;
  const int64_t ldx = a.ldx;
  const int64_t full = W.cols / 16 * 16;
  const int64_t padded = (W.cols + 15) / 16 * 16;
  const TypeTraits* tt = type_traits(W.type);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m256 lo[T], hi[T];
    for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m256 w0 = Dec::load(row, c), w1 = Dec::load(row, c + 8);
      for (int t = 0; t < T; t++) {
        lo[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), lo[t]);
        hi[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + c + 8), hi[t]);
      }
    }
    if (padded != full) {  // zero-padded tail, as the canonical order says
      alignas(32) float wt[16] = {0};
      tt->dequant(row + (size_t)full * tt->type_size, wt, W.cols - full);
      const __m256 w0 = _mm256_load_ps(wt), w1 = _mm256_load_ps(wt + 8);
      for (int t = 0; t < T; t++) {
        alignas(32) float xt[16] = {0};
        std::memcpy(xt, x + t * ldx + full, (W.cols - full) * sizeof(float));
        lo[t] = _mm256_fmadd_ps(w0, _mm256_load_ps(xt), lo[t]);
        hi[t] = _mm256_fmadd_ps(w1, _mm256_load_ps(xt + 8), hi[t]);
      }
    }
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(lo[t], hi[t]);
  }
}

// Q8_0 (the 32-value block type with float activations; the others are cpu/b32q_impl.h's): decode(block, w)
// gives the block's weights 0-7, 8-15, 16-23, 24-31, each exactly the float the scalar dequantizer forms.
inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
// w = d * v (+ m): v's 32 int8 values as floats, 8 at a time.
template <bool kMin>
inline void scale32(__m128i v_lo, __m128i v_hi, __m256 d, __m256 m, __m256* w) {
  const __m128i parts[4] = {v_lo, _mm_srli_si128(v_lo, 8), v_hi, _mm_srli_si128(v_hi, 8)};
  for (int k = 0; k < 4; k++) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
    w[k] = kMin ? _mm256_fmadd_ps(d, v, m) : _mm256_mul_ps(d, v);
  }
}
struct BlkQ8_0 {  // [d f16][32 int8]: w = d * q
  static constexpr int kBytes = 34;
  static void decode(const uint8_t* b, __m256* w) {
    scale32<false>(_mm_loadu_si128((const __m128i*)(b + 2)), _mm_loadu_si128((const __m128i*)(b + 18)),
                   _mm256_set1_ps(f16_at(b)), _mm256_setzero_ps(), w);
  }
};

template <class Blk, int T>
void rows_b32_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const float* x = a.x;
  const int64_t ldx = a.ldx;
  const int64_t nb = W.cols / 32;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m256 lo[T], hi[T];
    for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      __m256 w[4];
      kq::prefetch_ahead<Blk::kBytes>(row + b * Blk::kBytes);
      Blk::decode(row + b * Blk::kBytes, w);
      const float* xb = x + b * 32;
      for (int t = 0; t < T; t++) {
        const float* xt = xb + t * ldx;
        lo[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xt), lo[t]);
        hi[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), hi[t]);
        lo[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), lo[t]);
        hi[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), hi[t]);
      }
    }
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(lo[t], hi[t]);
  }
}

template <class Dec>
void rows_plain(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_rows(a.T, [&](auto t) { rows_plain_t<Dec, decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

template <class Blk>
void rows_b32(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_rows(a.T, [&](auto t) { rows_b32_t<Blk, decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

}  // namespace

RowsFn rows_fn_avx2(uint32_t type) {
  switch (type) {
    case GGML_F32: return rows_plain<DecF32>;
    case GGML_F16: return rows_plain<DecF16>;
    case GGML_BF16: return rows_plain<DecBF16>;
    case GGML_Q8_0: return rows_b32<BlkQ8_0>;
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_IQ4_NL: case GGML_MXFP4:
      return b32q_rows_fn(type);  // int8 activations per 32 values (cpu/b32q_impl.h)
    default: return nullptr;
  }
}

}  // namespace strata
