// AVX-512 row-product kernels (compiled with -mavx512*; chosen at run time). Each weight row is decoded
// once per pass and multiplied into all T activation rows; per row the order is the canonical one of
// matmul.h, so results are bit-identical to matmul_ref.cpp and independent of T.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/blocks32.h"
#include "kernels/cpu/b32q_impl.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"

namespace strata {

namespace {

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

// Register blocking: T activation rows are a compile-time constant (the accumulators live in registers),
// and for small T, R weight rows are decoded and accumulated side by side so that independent FMA chains
// hide the FMA latency. Each output element still receives the same FMAs in the same order as the
// canonical one-row loop, so results are unchanged (bit-identical to the scalar twin).
template <int T>
constexpr int rows_per_block() {
  return T == 1 ? 4 : 2;  // (T = 3-4 with one weight row: T chains of two dependent FMAs per block, latency-bound)
}

template <class Dec, int T, int R>
inline void plain_block(const MatView& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t r, int64_t full,
                        int rem, __mmask16 m) {
  const uint8_t* row[R];
  __m512 acc[R][T];
  for (int i = 0; i < R; i++) {
    row[i] = W.data + (r + i) * W.row_bytes;
    for (int t = 0; t < T; t++) acc[i][t] = _mm512_setzero_ps();
  }
  const size_t step = (size_t)R * 16 * (W.row_bytes / W.cols);  // bytes of the R rows per 16 columns
  for (int64_t c = 0; c < full; c += 16) {
    __m512 w[R];
    for (size_t o = 0; o < step; o += 64)  // the next group of rows (see block32)
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row[0]) + R * W.row_bytes + (c / 16) * step + o),
                   _MM_HINT_T0);
    for (int i = 0; i < R; i++) w[i] = Dec::load(row[i], c);
    for (int t = 0; t < T; t++) {
      const __m512 xv = _mm512_loadu_ps(x + t * ldx + c);
      for (int i = 0; i < R; i++) acc[i][t] = _mm512_fmadd_ps(w[i], xv, acc[i][t]);
    }
  }
  if (rem) {
    __m512 w[R];
    for (int i = 0; i < R; i++) w[i] = Dec::load_tail(row[i], full, m);
    for (int t = 0; t < T; t++) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * ldx + full);
      for (int i = 0; i < R; i++) acc[i][t] = _mm512_fmadd_ps(w[i], xv, acc[i][t]);
    }
  }
  for (int i = 0; i < R; i++)
    for (int t = 0; t < T; t++) y[t * ldy + r + i] = reduce16(acc[i][t]);
}

template <class Dec, int T>
void rows_plain_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int R = rows_per_block<T>();
  const int64_t full = W.cols / 16 * 16;
  const int rem = (int)(W.cols - full);
  const __mmask16 m = (__mmask16)((1u << rem) - 1);
  int64_t r = r0;
  for (; r + R <= r1; r += R) plain_block<Dec, T, R>(W, a.x, a.ldx, y, ldy, r, full, rem, m);
  for (; r < r1; r++) plain_block<Dec, T, 1>(W, a.x, a.ldx, y, ldy, r, full, rem, m);
}

// Q8_0 (the 32-value block type with float activations; the others are cpu/b32q_impl.h's): decode(block, w0, w1)
// gives the block's weights 0-15 and 16-31, each exactly the float the scalar dequantizer forms.
inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
struct BlkQ8_0 {  // [d f16][32 int8]: w = d * q
  static constexpr int kBytes = 34;
  static void decode(const uint8_t* b, __m512& w0, __m512& w1) {
    const __m512 d = _mm512_set1_ps(f16_at(b));
    w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 2)))));
    w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 18)))));
  }
};

// Activation row t's block b at x + b * bstride + t * ldx: plain rows (32, row stride) or rows packed
// block-major (32 * T, 32), where one base pointer reaches every row (T row pointers exhaust the
// general registers and the loop reloads them).
template <class Blk, int T, int R>
inline void block32(const MatView& W, const float* x, int64_t bstride, int64_t ldx, float* y, int64_t ldy, int64_t r) {
  const int64_t nb = W.cols / 32;
  const uint8_t* row[R];
  __m512 acc[R][T];
  for (int i = 0; i < R; i++) {
    row[i] = W.data + (r + i) * W.row_bytes;
    for (int t = 0; t < T; t++) acc[i][t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; b++) {
    __m512 w0[R], w1[R];
    {
      // The R rows of a block are R short streams (one row each), which the hardware prefetcher picks up
      // late; the next group of R rows is contiguous: stream it in at this group's pace. (Weights streamed
      // from DRAM: Q8_0 T = 1 18 -> 52 GB/s, T = 8 9 -> 13 GB/s; no change when they sit in the cache.)
      // (an address, not a pointer into the matrix: past the last group it points beyond it, and a prefetch
      // never faults)
      const char* ahead =
          reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row[0]) + R * W.row_bytes + b * R * Blk::kBytes);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      if (R * Blk::kBytes > 128) _mm_prefetch(ahead + 128, _MM_HINT_T0);
    }
    for (int i = 0; i < R; i++) Blk::decode(row[i] + b * Blk::kBytes, w0[i], w1[i]);
    const float* xb = x + b * bstride;
    for (int t = 0; t < T; t++) {
      const __m512 x0 = _mm512_loadu_ps(xb + t * ldx), x1 = _mm512_loadu_ps(xb + t * ldx + 16);
      for (int i = 0; i < R; i++) {
        acc[i][t] = _mm512_fmadd_ps(w0[i], x0, acc[i][t]);
        acc[i][t] = _mm512_fmadd_ps(w1[i], x1, acc[i][t]);
      }
    }
  }
  for (int i = 0; i < R; i++)
    for (int t = 0; t < T; t++) y[t * ldy + r + i] = reduce16(acc[i][t]);
}

template <class Blk, int T>
void rows_b32_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int R = rows_per_block<T>();
  int64_t r = r0;
  constexpr int64_t kPackCols = 512;
  if (T >= 5 && W.cols <= kPackCols && r1 - r0 >= 16) {
    alignas(64) float xp[kMaxRowsPerPass * kPackCols];
    const int64_t nb = W.cols / 32;
    float* p = xp;
    for (int64_t b = 0; b < nb; b++)
      for (int t = 0; t < T; t++, p += 32)
        for (int j = 0; j < 32; j += 16) _mm512_store_ps(p + j, _mm512_loadu_ps(a.x + t * a.ldx + b * 32 + j));
    for (; r + R <= r1; r += R) block32<Blk, T, R>(W, xp, 32 * T, 32, y, ldy, r);
    for (; r < r1; r++) block32<Blk, T, 1>(W, xp, 32 * T, 32, y, ldy, r);
    return;
  }
  for (; r + R <= r1; r += R) block32<Blk, T, R>(W, a.x, 32, a.ldx, y, ldy, r);
  for (; r < r1; r++) block32<Blk, T, 1>(W, a.x, 32, a.ldx, y, ldy, r);
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

RowsFn rows_fn_avx512(uint32_t type) {
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
