// AVX-512 (VBMI + VNNI) int8-activation kernels that multiply 8-bit weights by 8-bit activations for Q4_K and
// Q5_K, where kquants_avx512.cpp's kernel widens every weight to 16 bits and multiplies its scale in (8
// widenings and 8 vpmullw per block before the first product). The arithmetic of matmul.h is unchanged: the 16
// lane sums P[k] (values v with (v mod 32) / 2 == k, over the block's 8 sub-blocks) are exact integers, so
// any exact way of forming them gives the same bits. Here, for each pair of sub-blocks (2c, 2c+1):
//   weights and activations are both laid out pair-interleaved: bytes 4k, 4k+1 = values 2k, 2k+1 of
//   sub-block 2c, bytes 4k+2, 4k+3 = the same values of sub-block 2c+1 (one vpermb of the weights per pair
//   and block; the activations are interleaved once per call, for every row of the call);
//   vpmaddubsw(codes, x) -> word 2k = sub-block 2c's pair k, word 2k+1 = sub-block 2c+1's pair k
//     (codes <= 31, |x| <= 127: a pair <= 7874, never saturates);
//   vpdpwssd with the words (s_2c, s_2c+1) repeated -> int32 lane k += s_2c p_2c[k] + s_2c+1 p_2c+1[k],
// so after the four pairs lane k holds P[k] in canonical order and L = fma(d dx, P, L) as before. The mins use
// the activation sub-block sums as the widening kernel does. Chosen at run time with VBMI (rows_fn_kq_avx512vbmi);
// tested bit-identical with the scalar twin on fresh random blocks (tests/test_quant_kernels.py).
#include <immintrin.h>

#include <vector>

#include "kernels/cpu/kq_common.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"

namespace strata {

namespace {

using namespace kq;

// vpermb indices: out byte 4k + e = in byte 2k + e (first sub-block), out byte 4k + 2 + e = in byte 32 + 2k + e
inline __m512i interleave_index() {
  alignas(64) uint8_t idx[64];
  for (int k = 0; k < 16; k++)
    for (int e = 0; e < 2; e++) {
      idx[4 * k + e] = (uint8_t)(2 * k + e);
      idx[4 * k + 2 + e] = (uint8_t)(32 + 2 * k + e);
    }
  return _mm512_load_si512(idx);
}

// Rows [0, T) of the activation (int8 values stored as int16) -> int8, pair-interleaved per 64 values.
inline void interleave_act(const QAct& q, int T, std::vector<int8_t>& out) {
  const __m512i idx = interleave_index();
  out.resize((size_t)T * (size_t)q.cols);
  for (int t = 0; t < T; t++) {
    const int16_t* src = q.q + (int64_t)t * q.ldq;
    int8_t* dst = out.data() + (int64_t)t * q.cols;
    for (int64_t c = 0; c < q.cols; c += 64) {
      const __m256i a = _mm512_cvtepi16_epi8(_mm512_loadu_si512(src + c));
      const __m256i b = _mm512_cvtepi16_epi8(_mm512_loadu_si512(src + c + 32));
      const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
      _mm512_storeu_si512(dst + c, _mm512_permutexvar_epi8(idx, ab));
    }
  }
}

// A decoded block: the pair-interleaved codes of sub-blocks (2c, 2c+1) in w[c], the int16 scale pairs, d, dmin,
// and the 6-bit mins.
struct Blk {
  __m512i w[4];
  uint32_t s2[4];
  float d, dmin;
  alignas(16) uint8_t m[8];
};

// The 32 code bytes of sub-blocks 2c (low nibbles) and 2c+1 (high nibbles) -> [low nibbles | high nibbles]
inline __m512i nibbles(const uint8_t* p) {
  const __m512i by = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_and_si512(_mm512_mask_srli_epi16(by, 0xFFFF0000u, by, 4), _mm512_set1_epi8(0x0F));
}

inline void scale_pairs(const uint8_t* sc, uint32_t* s2) {
  for (int c = 0; c < 4; c++) s2[c] = (uint32_t)sc[2 * c] | (uint32_t)sc[2 * c + 1] << 16;
}

struct Dec8Q4K {
  static constexpr int kBytes = 144;
  static inline void decode(const uint8_t* b, const __m512i idx, Blk& o) {
    uint8_t sc[8];
    k4_head(b, o.d, o.dmin, sc, o.m);
    scale_pairs(sc, o.s2);
    for (int c = 0; c < 4; c++) o.w[c] = _mm512_permutexvar_epi8(idx, nibbles(b + 16 + 32 * c));
  }
};

struct Dec8Q5K {
  static constexpr int kBytes = 176;
  static inline void decode(const uint8_t* b, const __m512i idx, Blk& o) {
    uint8_t sc[8];
    k4_head(b, o.d, o.dmin, sc, o.m);
    scale_pairs(sc, o.s2);
    // bit j of qh byte l is the fifth bit of value l of sub-block j: low half takes bit 2c, high half 2c+1
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
    const __m512i one = _mm512_set1_epi8(1);
    for (int c = 0; c < 4; c++) {
      const __m512i cnt = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * c)),
                                                  _mm512_set1_epi16((short)(2 * c + 1)));
      const __m512i hb = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, cnt), one), 4);
      o.w[c] = _mm512_permutexvar_epi8(idx, _mm512_or_si512(nibbles(b + 48 + 32 * c), hb));
    }
  }
};

template <class Dec, int T>
void rows_kq8_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t nb = W.cols / QK_K;
  const __m512i idx = interleave_index();
  const __m512i idx01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i idx23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  thread_local std::vector<int8_t> xp;  // per calling thread, from the shared read-only rows
  interleave_act(a.q, T, xp);
  const int64_t cols = a.q.cols;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m512 L[T];
    for (int t = 0; t < T; t++) L[t] = _mm512_setzero_ps();
    __m256 Lm = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* blk = row + b * Dec::kBytes;
      if (b + 1 < nb) _mm_prefetch(reinterpret_cast<const char*>(blk + Dec::kBytes + 64), _MM_HINT_T0);
      Blk k;
      Dec::decode(blk, idx, k);
      const float* dx = a.q.d + b * 8;
      for (int t = 0; t < T; t++) {
        const int8_t* x = xp.data() + t * cols + b * QK_K;
        __m512i P = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
          const __m512i p = _mm512_maddubs_epi16(k.w[c], _mm512_loadu_si512(x + 64 * c));
          P = _mm512_dpwssd_epi32(P, p, _mm512_set1_epi32((int)k.s2[c]));
        }
        L[t] = _mm512_fmadd_ps(_mm512_set1_ps(k.d * dx[t]), _mm512_cvtepi32_ps(P), L[t]);
      }
      // M = sum_j m[j] * bsum[j], all rows at once, as in kquants_avx512_impl.h
      const __m512i mz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(k.m))));
      const int16_t* bs = a.q.bsum + b * 64;
      const __m512i M16 = _mm512_add_epi32(_mm512_madd_epi16(_mm512_loadu_si512(bs), _mm512_permutexvar_epi32(idx01, mz)),
                                           _mm512_madd_epi16(_mm512_loadu_si512(bs + 32), _mm512_permutexvar_epi32(idx23, mz)));
      const __m256i M8 = _mm256_add_epi32(_mm512_castsi512_si256(M16), _mm512_extracti64x4_epi64(M16, 1));
      Lm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(k.dmin), _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(M8), Lm);
    }
    alignas(32) float lm[8];
    _mm256_store_ps(lm, Lm);
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(L[t]) - lm[t];
  }
}

template <class Dec>
void rows_kq8(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_rows(a.T, [&](auto t) { rows_kq8_t<Dec, decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

}  // namespace

RowsFn rows_fn_kq8_avx512vbmi(uint32_t type) {
  switch (type) {
    case GGML_Q4_K: return rows_kq8<Dec8Q4K>;
    case GGML_Q5_K: return rows_kq8<Dec8Q5K>;
    default: return nullptr;
  }
}

}  // namespace strata
