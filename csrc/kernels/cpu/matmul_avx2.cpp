// AVX2 + FMA row-product kernels: the 16 canonical lanes live in two 8-wide registers (lanes 0-7, 8-15),
// so per row the arithmetic is the canonical order of matmul.h, bit-identical to the scalar twins.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

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

// Register blocking, as in matmul_avx512.cpp: T activation rows are a compile-time constant (the accumulators
// live in registers), and for small T, R weight rows are decoded and accumulated side by side, so that 8
// independent FMA chains hide the FMA latency (one row at T = 1 is two chains of one FMA per 8 columns: bound by
// the FMA latency, not by the weights' bytes). Each output element still receives the same FMAs in the same order
// as the canonical one-row loop, so results are unchanged (bit-identical to the scalar twin).
template <int T>
constexpr int rows_per_block() {
  return T == 1 ? 4 : 1;  // 2 T R chains: 8 at T = 1; T = 2 with 2 rows measured slower (F16: 82 -> 96 us)
}

// Prefetch the part of the next group of R weight rows that this step's part of the group corresponds to: the R
// rows of a group are R short streams that the hardware prefetcher picks up late, but the next group is contiguous,
// so it streams in at this group's pace. (An address, not a pointer into the matrix: past the last group it points
// beyond it, and a prefetch never faults.)
template <int R>
inline void prefetch_next_group(const uint8_t* row0, size_t row_bytes, size_t offset, size_t bytes) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(row0) + R * row_bytes + R * offset;
  for (size_t o = 0; o < R * bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + o), _MM_HINT_T0);
}

template <class Dec, int T, int R>
inline void plain_block(const MatView& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t r, int64_t full,
                        int64_t padded) {
  const uint8_t* row[R];
  __m256 lo[R][T], hi[R][T];
  for (int i = 0; i < R; i++) {
    row[i] = W.data + (r + i) * W.row_bytes;
    for (int t = 0; t < T; t++) lo[i][t] = hi[i][t] = _mm256_setzero_ps();
  }
  const size_t wbytes = W.row_bytes / W.cols;  // bytes a weight (F32 4, F16 / BF16 2)
  for (int64_t c = 0; c < full; c += 16) {
    if (R > 1 && c % 32 == 0) prefetch_next_group<R>(row[0], W.row_bytes, c * wbytes, 32 * wbytes);
    for (int i = 0; i < R; i++) {
      const __m256 w0 = Dec::load(row[i], c), w1 = Dec::load(row[i], c + 8);
      for (int t = 0; t < T; t++) {
        lo[i][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), lo[i][t]);
        hi[i][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + c + 8), hi[i][t]);
      }
    }
  }
  if (padded != full) {  // zero-padded tail, as the canonical order says
    const TypeTraits* tt = type_traits(W.type);
    for (int t = 0; t < T; t++) {
      alignas(32) float xt[16] = {0};
      std::memcpy(xt, x + t * ldx + full, (W.cols - full) * sizeof(float));
      for (int i = 0; i < R; i++) {
        alignas(32) float wt[16] = {0};
        tt->dequant(row[i] + (size_t)full * tt->type_size, wt, W.cols - full);
        lo[i][t] = _mm256_fmadd_ps(_mm256_load_ps(wt), _mm256_load_ps(xt), lo[i][t]);
        hi[i][t] = _mm256_fmadd_ps(_mm256_load_ps(wt + 8), _mm256_load_ps(xt + 8), hi[i][t]);
      }
    }
  }
  for (int i = 0; i < R; i++)
    for (int t = 0; t < T; t++) y[t * ldy + r + i] = reduce16(lo[i][t], hi[i][t]);
}

// 6-8 activation rows as two groups of at most 4, each over the weights once: 2 T accumulators and the weights'
// registers would not fit 16 (spilled, Q8_0 512 x 2048: T = 8 at 20.8 GMAC/s against 26.4 at T = 5). Each group's
// rows get the same kernel call as alone, so the same bits.
template <int T>
constexpr int first_group() {
  return T >= 6 ? (T + 1) / 2 : T;
}
// run(rows, part, y_part) for the first_group<T>() rows of a, then the rest (rows: a compile-time row count)
template <int T, class F>
inline void in_two_groups(const Act& a, float* y, int64_t ldy, F&& run) {
  constexpr int T0 = first_group<T>();
  Act b = a;
  b.x = a.x + T0 * a.ldx;
  run(std::integral_constant<int, T0>{}, a, y);
  run(std::integral_constant<int, T - T0>{}, b, y + T0 * ldy);
}

template <class Dec, int T>
void rows_plain_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if constexpr (first_group<T>() < T) {
    return in_two_groups<T>(a, y, ldy, [&](auto n, const Act& part, float* yp) {
      rows_plain_t<Dec, decltype(n)::value>(W, part, yp, ldy, r0, r1);
    });
  }
  constexpr int R = rows_per_block<T>();
  const int64_t full = W.cols / 16 * 16;
  const int64_t padded = (W.cols + 15) / 16 * 16;
  int64_t r = r0;
  for (; r + R <= r1; r += R) plain_block<Dec, T, R>(W, a.x, a.ldx, y, ldy, r, full, padded);
  for (; r < r1; r++) plain_block<Dec, T, 1>(W, a.x, a.ldx, y, ldy, r, full, padded);
}

// Q8_0 (the 32-value block type with float activations; the others are cpu/b32q_impl.h's): decode(block, w)
// gives the block's weights 0-7, 8-15, 16-23, 24-31, each exactly the float the scalar dequantizer forms.
struct BlkQ8_0 {  // [d f16][32 int8]: w = d * q (exact: 11 bits of d times 8 of q)
  static constexpr int kBytes = 34;
  static void decode(const uint8_t* b, __m256* w) {
    // each 8 values sign-extended straight from memory (vpmovsxbd ymm, m64: no 16-byte load and byte shift)
    const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16((short)(uint16_t)(b[0] | b[1] << 8)));
    for (int k = 0; k < 4; k++)
      w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(b + 2 + 8 * k)))));
  }
};

template <class Blk, int T, int R>
inline void block32(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r) {
  const float* x = a.x;
  const int64_t ldx = a.ldx;
  const int64_t nb = W.cols / 32;
  const uint8_t* row[R];
  __m256 lo[R][T], hi[R][T];
  for (int i = 0; i < R; i++) {
    row[i] = W.data + (r + i) * W.row_bytes;
    for (int t = 0; t < T; t++) lo[i][t] = hi[i][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; b++) {
    if constexpr (R > 1) {
      prefetch_next_group<R>(row[0], W.row_bytes, b * Blk::kBytes, Blk::kBytes);
    } else {
      kq::prefetch_ahead<Blk::kBytes>(row[0] + b * Blk::kBytes);
    }
    const float* xb = x + b * 32;
    for (int i = 0; i < R; i++) {
      __m256 w[4];
      Blk::decode(row[i] + b * Blk::kBytes, w);
      for (int t = 0; t < T; t++) {
        const float* xt = xb + t * ldx;
        lo[i][t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xt), lo[i][t]);
        hi[i][t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), hi[i][t]);
        lo[i][t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), lo[i][t]);
        hi[i][t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), hi[i][t]);
      }
    }
  }
  for (int i = 0; i < R; i++)
    for (int t = 0; t < T; t++) y[t * ldy + r + i] = reduce16(lo[i][t], hi[i][t]);
}

template <class Blk, int T>
void rows_b32_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if constexpr (first_group<T>() < T) {  // (as rows_plain_t)
    return in_two_groups<T>(a, y, ldy, [&](auto n, const Act& part, float* yp) {
      rows_b32_t<Blk, decltype(n)::value>(W, part, yp, ldy, r0, r1);
    });
  }
  constexpr int R = rows_per_block<T>();
  int64_t r = r0;
  for (; r + R <= r1; r += R) block32<Blk, T, R>(W, a, y, ldy, r);
  for (; r < r1; r++) block32<Blk, T, 1>(W, a, y, ldy, r);
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
