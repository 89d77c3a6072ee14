// The AVX-512 int8-activation kernel template and the weight-block decoders of kquants_avx512.cpp, shared
// with kquants_avx512vbmi.cpp (the IQ2_XXS decoder that needs AVX-512 VBMI). Internal linkage: each
// translation unit is built with its own ISA flags and gets its own copy.
#pragma once
#include <immintrin.h>

#include <vector>

#include "kernels/cpu/kq_common.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"

namespace strata {
namespace {

using namespace kq;

struct DecQ4K {
  static constexpr int kBytes = 144;
  static constexpr bool kHasMin = true;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    alignas(16) uint8_t sc[8], m[8];
    k4_head(b, d, dmin, sc, m);
    mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
      const __m256i by = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
      const __m256i lo = _mm256_and_si256(by, m4), hi = _mm256_and_si256(_mm256_srli_epi16(by, 4), m4);
      w[2 * c] = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(lo), _mm512_set1_epi16(sc[2 * c]));
      w[2 * c + 1] = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(hi), _mm512_set1_epi16(sc[2 * c + 1]));
    }
  }
};

struct DecQ5K {
  static constexpr int kBytes = 176;
  static constexpr bool kHasMin = true;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    alignas(16) uint8_t sc[8], m[8];
    k4_head(b, d, dmin, sc, m);
    mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m512i qh = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
    const __m512i one = _mm512_set1_epi16(1);
    for (int c = 0; c < 4; c++) {
      const __m256i by = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * c));
      const __m256i lo = _mm256_and_si256(by, m4), hi = _mm256_and_si256(_mm256_srli_epi16(by, 4), m4);
      const int j0 = 2 * c, j1 = 2 * c + 1;
      __m512i q0 = _mm512_or_si512(_mm512_cvtepu8_epi16(lo),
                                   _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, j0), one), 4));
      __m512i q1 = _mm512_or_si512(_mm512_cvtepu8_epi16(hi),
                                   _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, j1), one), 4));
      w[j0] = _mm512_mullo_epi16(q0, _mm512_set1_epi16(sc[j0]));
      w[j1] = _mm512_mullo_epi16(q1, _mm512_set1_epi16(sc[j1]));
    }
  }
};

// Q2_K/Q3_K/Q6_K: sixteen scales (words 0-15 of sc16), one per 16 values -> the multiplier of sub-block j's 32
// values: scale 2j in words 0-15, scale 2j+1 in words 16-31.
inline __m512i scales_of_halves(__m512i sc16, int j) {
  const __m512i half = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_epi16(_mm512_add_epi16(half, _mm512_set1_epi16((short)(2 * j))), sc16);
}

struct DecQ6K {
  static constexpr int kBytes = 210;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b + 208);
    dmin = 0.f;
    mins = _mm_setzero_si128();
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192))));
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const __m512i k32 = _mm512_set1_epi16(32);
    for (int h = 0; h < 2; h++) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      for (int k = 0; k < 4; k++) {
        const int j = 4 * h + k;
        const __m256i ql = (k & 1) ? ql1 : ql0;
        const __m256i lo = (k >> 1) ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) : _mm256_and_si256(ql, m4);
        const __m256i hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2), 4);
        const __m512i q = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm256_or_si256(lo, hb)), k32);
        w[j] = _mm512_mullo_epi16(q, scales_of_halves(sc, j));
      }
    }
  }
};

struct DecIQ2XXS {
  static constexpr int kBytes = 66;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t* q = b + 2 + 8 * ib;
      const uint32_t aux1 = u32_at(q + 4);
      const __m256i g = _mm256_set_epi64x((long long)kIq2xxsGrid[q[3]], (long long)kIq2xxsGrid[q[2]],
                                          (long long)kIq2xxsGrid[q[1]], (long long)kIq2xxsGrid[q[0]]);
      w[ib] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(iq_signed(g, aux1)), _mm512_set1_epi16((short)(2 * (aux1 >> 28) + 1)));
    }
  }
};

struct DecIQ3XXS {
  static constexpr int kBytes = 98;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.25f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t* q = b + 2 + 8 * ib;
      const uint32_t aux = u32_at(b + 66 + 4 * ib);
      const __m256i g = _mm256_set_epi32((int)kIq3xxsGrid[q[7]], (int)kIq3xxsGrid[q[6]], (int)kIq3xxsGrid[q[5]],
                                         (int)kIq3xxsGrid[q[4]], (int)kIq3xxsGrid[q[3]], (int)kIq3xxsGrid[q[2]],
                                         (int)kIq3xxsGrid[q[1]], (int)kIq3xxsGrid[q[0]]);
      w[ib] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(iq_signed(g, aux)), _mm512_set1_epi16((short)(2 * (aux >> 28) + 1)));
    }
  }
};

struct DecQ2K : Q2KBlock {
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b + 80);
    dmin = h2f(b + 82);
    mins = _mm_setzero_si128();
    // the 16 scales (low nibbles) as words; sub-block j multiplies its halves by scales 2j and 2j+1
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(
        _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), _mm_set1_epi8(0x0F))));
    for (int h = 0; h < 2; h++) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * h));
      for (int k = 0; k < 4; k++) {
        const int j = 4 * h + k;  // values 32 j ..: bits 2k of qs[32h + l]
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), _mm256_set1_epi8(3));
        w[j] = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(q), scales_of_halves(sc, j));
      }
    }
  }
};

struct DecQ3K {
  static constexpr int kBytes = 110;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b + 108);
    dmin = 0.f;
    mins = _mm_setzero_si128();
    alignas(16) int8_t sc8[16];
    q3k_scales_simd(b + 96, sc8);
    // the 16 scales as words; sub-block j multiplies its halves by scales 2j and 2j+1
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(sc8))));
    for (int j = 0; j < 8; j++)
      w[j] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(q3k_codes(b, j)), scales_of_halves(sc, j));
  }
};

struct DecIQ4XS {
  static constexpr int kBytes = 136;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b);
    dmin = 0.f;
    mins = _mm_setzero_si128();
    const __m256i values = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int ib = 0; ib < 8; ib++) {
      const __m128i by = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 + 16 * ib));
      // codes of values 0-15 (low nibbles) | 16-31 (high nibbles), then the 16-entry table in each half
      const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(by, 4), m4), _mm_and_si128(by, m4));
      w[ib] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm256_shuffle_epi8(values, codes)),
                                 _mm512_set1_epi16((short)(iq4xs_scale(b, ib) - 32)));
    }
  }
};

// The low-bit grid types (iq_lowbit.cpp): per sub-block of 32 values, the grid bytes of its groups, signs
// (or IQ1's +-1 shifts) and the multipliers 2s+1, in words 0-15 and 16-31 where the scale is per 16 values.
inline __m512i halves(int lo, int hi) {  // words 0-15 = lo, 16-31 = hi
  return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)lo), _mm512_set1_epi16((short)hi));
}
inline __m512i negate_where(__m512i w, uint32_t bits) {  // w[v] = -w[v] where bit v is set
  return _mm512_mask_sub_epi16(w, (__mmask32)bits, _mm512_setzero_si512(), w);
}


struct DecIQ2XS {  // grid index 9 bits + ksigns index 7 bits per 8 values; a 4-bit scale per 16
  static constexpr int kBytes = 74;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    for (int ib = 0; ib < 8; ib++) {
      const int sc = b[66 + ib];
      w[ib] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(iq2xs_signed(b + 2 + 8 * ib)),
                                 halves(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1));
    }
  }
};

struct DecIQ2S {  // grid index 8 + 2 bits per 8 values, a sign bit per value, a 4-bit scale per 16
  static constexpr int kBytes = 82;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    for (int ib = 0; ib < 8; ib++) {
      const __m256i g = gather4(kIq2sGrid, grid_index4(b + 2 + 4 * ib, b[66 + ib], _mm_setr_epi32(0, 2, 4, 6), 3));
      const int sc = b[74 + ib];
      w[ib] = _mm512_mullo_epi16(negate_where(_mm512_cvtepu8_epi16(g), u32_at(b + 34 + 4 * ib)),
                                 halves(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1));
    }
  }
};

struct DecIQ3S {  // grid index 8 + 1 bits per 4 values, a sign bit per value, a 4-bit scale per 32
  static constexpr int kBytes = 110;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b);
    dmin = 0.f;
    mins = _mm_setzero_si128();
    for (int ib = 0; ib < 8; ib++) {
      const __m256i g = iq3s_groups(b, ib);
      const int sc = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
      w[ib] = _mm512_mullo_epi16(negate_where(_mm512_cvtepu8_epi16(g), u32_at(b + 74 + 4 * ib)),
                                 _mm512_set1_epi16((short)(2 * sc + 1)));
    }
  }
};

// IQ1: w = (2s+1) * (8 g + shift), g in {-1, 0, 1} and shift = +-1 per 8 values (the 1/8 is in d).
inline __m512i iq1_shifted(__m256i g, __m512i shift, __m512i mult) {
  return _mm512_mullo_epi16(_mm512_add_epi16(_mm512_slli_epi16(_mm512_cvtepi8_epi16(g), 3), shift), mult);
}

struct DecIQ1S {  // grid index 8 + 3 bits per 8 values; per 32: a 3-bit scale and the shift's sign
  static constexpr int kBytes = 50;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    for (int ib = 0; ib < 8; ib++) {
      const int qh = b[34 + 2 * ib] | b[35 + 2 * ib] << 8;
      const __m256i g = gather4(kIq1sGrid, grid_index4(b + 2 + 4 * ib, (uint32_t)qh, _mm_setr_epi32(0, 3, 6, 9), 7));
      w[ib] = iq1_shifted(g, _mm512_set1_epi16((qh & 0x8000) ? -1 : 1), _mm512_set1_epi16((short)(2 * ((qh >> 12) & 7) + 1)));
    }
  }
};

struct DecIQ1M {  // grid index 8 + 3 bits and the shift's sign per 8 values; a 3-bit scale per 16
  static constexpr int kBytes = 56;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = fp16_to_f32(iq1m_d_bits(b)) * 0.125f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    // the sixteen multipliers 2s+1 as words 0-15 (scale k = bits 3(k % 4).. of scale word k / 4)
    const __m256i words = _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                                   _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 48))));
    const __m256i sc = _mm256_and_si256(_mm256_srlv_epi16(words, _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
                                        _mm256_set1_epi16(7));
    const __m512i mult = _mm512_castsi256_si512(_mm256_add_epi16(_mm256_add_epi16(sc, sc), _mm256_set1_epi16(1)));
    const __m512i one = _mm512_set1_epi16(1), minus = _mm512_set1_epi16(-1);
    for (int ib = 0; ib < 8; ib++) {
      const uint32_t h = (uint32_t)b[32 + 2 * ib] | (uint32_t)b[33 + 2 * ib] << 8;  // four nibbles, group l at 4l
      const __m256i g = gather4(kIq1sGrid, grid_index4(b + 4 * ib, h, _mm_setr_epi32(0, 4, 8, 12), 7));
      // group l's 8 words take -1 where bit 4l + 3 of h is set: spread those 4 bits to 8 mask bits each
      const uint32_t neg = (uint32_t)_pdep_u32(_pext_u32(h, 0x8888u), 0x01010101u) * 0xFFu;
      const __m512i sh = _mm512_mask_blend_epi16((__mmask32)neg, one, minus);
      w[ib] = iq1_shifted(g, sh, scales_of_halves(mult, ib));
    }
  }
};

template <bool kVnni>
inline __m512i dot16(__m512i acc, __m512i w, __m512i q) {
  if constexpr (kVnni) return _mm512_dpwssd_epi32(acc, w, q);
  else return _mm512_add_epi32(acc, _mm512_madd_epi16(w, q));
}

// T is a compile-time constant so that the T accumulators stay in registers (a runtime-indexed array of
// __m512 spills); the arithmetic per output element is unchanged.
template <class Dec, bool kVnni, int T>
void rows_kq_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t nb = W.cols / QK_K;
  thread_local std::vector<int16_t> sums16;  // per calling thread, from the shared read-only rows
  if constexpr (HasMins16<Dec>::value) act_sums16(a.q, sums16);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m512 L[T];
    for (int t = 0; t < T; t++) L[t] = _mm512_setzero_ps();
    __m256 Lm = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* blk = row + b * Dec::kBytes;
      prefetch_ahead<Dec::kBytes>(blk);
      __m512i w[8];
      float d, dmin;
      __m128i mins;
      Dec::decode(blk, w, d, dmin, mins);
      const int16_t* qb = a.q.q + b * QK_K;
      const float* dx = a.q.d + b * 8;
      for (int t = 0; t < T; t++) {
        const int16_t* q = qb + t * a.q.ldq;
        // two independent chains (integer sums: the split does not change P)
        __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
        for (int j = 0; j < 8; j += 2) {
          a0 = dot16<kVnni>(a0, w[j], _mm512_loadu_si512(q + 32 * j));
          a1 = dot16<kVnni>(a1, w[j + 1], _mm512_loadu_si512(q + 32 * j + 32));
        }
        L[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * dx[t]), _mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), L[t]);
      }
      if constexpr (HasMins16<Dec>::value) {
        // M = sum_s m16[s] * (sum of the 16 activation values of group s), all rows at once (act_sums16)
        alignas(16) int16_t m16[16];
        Dec::mins16(blk, m16);
        Lm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_loadu_ps(dx)),
                             _mm256_cvtepi32_ps(min_sums16(m16, sums16.data() + b * 128)), Lm);
      } else if constexpr (Dec::kHasMin) {
        Lm = mins_fma(mins, a.q.bsum + b * 64, dmin, dx, Lm);
      }
    }
    alignas(32) float lm[8];
    _mm256_store_ps(lm, Lm);
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(L[t]) - lm[t];
  }
}

template <class Dec, bool kVnni>
void rows_kq(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_rows(a.T, [&](auto t) { rows_kq_t<Dec, kVnni, decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

template <class Dec>
RowsFn pick() {
  return cpu_has_avx512vnni() ? rows_kq<Dec, true> : rows_kq<Dec, false>;
}

// Many passes (a prompt window of more than kMaxRowsPerPass rows): kPanelRows weight rows are decoded once
// into a panel and multiplied from it into every pass, instead of being decoded again for each pass of 8
// activation rows. Each output element receives the float operations of rows_kq_t in the same order (the
// decoded registers are stored and reloaded unchanged), so the results are bit-identical. Its exact integer
// lane sums P are formed its own way: one vpmaddwd chain per row and block with no zeroed start (12 % faster
// at 64-512 rows; at T <= 8 rows_kq_t's two chains measured faster). Decoders with per-16 mins (Q2_K) keep the
// per-pass path: their activation sums are per pass.
struct alignas(64) PanelBlock {
  __m512i w[8];
  __m128i mins;
  float d, dmin;
};
constexpr int64_t kPanelRows = 8;

template <class Dec, bool kVnni, int T>
inline void panel_row(const PanelBlock* pb, int64_t nb, const Act& a, float* y, int64_t ldy, int64_t r) {
  __m512 L[T];
  for (int t = 0; t < T; t++) L[t] = _mm512_setzero_ps();
  __m256 Lm = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const PanelBlock& B = pb[b];
    const int16_t* qb = a.q.q + b * QK_K;
    const float* dx = a.q.d + b * 8;
    // the rows' d * dx in one multiply, each broadcast from memory (a load, not a shuffle on the vector ports)
    alignas(32) float dd[8];
    _mm256_store_ps(dd, _mm256_mul_ps(_mm256_set1_ps(B.d), _mm256_loadu_ps(dx)));
    for (int t = 0; t < T; t++) {
      const int16_t* q = qb + t * a.q.ldq;
      // one chain from a plain vpmaddwd (integer sums: neither the order nor the start changes P)
      __m512i acc = _mm512_madd_epi16(_mm512_load_si512(&B.w[0]), _mm512_loadu_si512(q));
      for (int j = 1; j < 8; j++) acc = dot16<kVnni>(acc, _mm512_load_si512(&B.w[j]), _mm512_loadu_si512(q + 32 * j));
      L[t] = _mm512_fmadd_ps(_mm512_broadcastss_ps(_mm_load_ss(dd + t)), _mm512_cvtepi32_ps(acc), L[t]);
    }
    if constexpr (Dec::kHasMin) Lm = mins_fma(B.mins, a.q.bsum + b * 64, B.dmin, dx, Lm);
  }
  alignas(32) float lm[8];
  _mm256_store_ps(lm, Lm);
  for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(L[t]) - lm[t];
}

template <class Dec, bool kVnni>
void rows_kq_many(const MatView& W, const Act* pass, int np, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  static_assert(!HasMins16<Dec>::value, "per-16 mins: the per-pass path");
  const int64_t nb = W.cols / QK_K;
  thread_local std::vector<PanelBlock> panel;  // [kPanelRows][nb]
  if ((int64_t)panel.size() < kPanelRows * nb) panel.resize(kPanelRows * nb);
  for (int64_t rb = r0; rb < r1; rb += kPanelRows) {
    const int64_t re = rb + kPanelRows < r1 ? rb + kPanelRows : r1;
    for (int64_t r = rb; r < re; r++) {
      const uint8_t* row = W.data + r * W.row_bytes;
      PanelBlock* pb = panel.data() + (r - rb) * nb;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t* blk = row + b * Dec::kBytes;
        prefetch_ahead<Dec::kBytes>(blk);
        Dec::decode(blk, pb[b].w, pb[b].d, pb[b].dmin, pb[b].mins);
      }
    }
    for (int p = 0; p < np; p++)
      with_rows(pass[p].T, [&](auto t) {
        for (int64_t r = rb; r < re; r++)
          panel_row<Dec, kVnni, decltype(t)::value>(panel.data() + (r - rb) * nb, nb, pass[p],
                                                    y + (int64_t)p * kMaxRowsPerPass * ldy, ldy, r);
      });
  }
}

template <class Dec>
RowsManyFn pick_many() {
  if constexpr (HasMins16<Dec>::value) return nullptr;
  else return cpu_has_avx512vnni() ? rows_kq_many<Dec, true> : rows_kq_many<Dec, false>;
}

}  // namespace
}  // namespace strata
