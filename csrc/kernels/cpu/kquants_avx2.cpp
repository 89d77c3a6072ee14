// AVX2 int8-activation kernels for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ3_XXS, IQ4_XS (matmul.h states the arithmetic).
// A block decodes to sixteen 16 x int16 registers: w[2j] holds values 0..15 of sub-block j (canonical
// lanes 0-7 after vpmaddwd), w[2j+1] values 16..31 (lanes 8-15), so the lane sums equal the AVX-512 ones.
#include <immintrin.h>

#include "kernels/cpu/kq_common.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"

namespace strata {

namespace {

using namespace kq;

inline __m256i lo16u(__m256i v) { return _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)); }
inline __m256i hi16u(__m256i v) { return _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)); }
inline __m256i lo16s(__m256i v) { return _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)); }
inline __m256i hi16s(__m256i v) { return _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)); }

struct DecQ4K {
  static constexpr int kBytes = 144;
  static constexpr bool kHasMin = true;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    uint8_t sc[8];
    k4_head(b, d, dmin, sc, m);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
      const __m256i by = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
      const __m256i lo = _mm256_and_si256(by, m4), hi = _mm256_and_si256(_mm256_srli_epi16(by, 4), m4);
      const __m256i s0 = _mm256_set1_epi16(sc[2 * c]), s1 = _mm256_set1_epi16(sc[2 * c + 1]);
      w[4 * c + 0] = _mm256_mullo_epi16(lo16u(lo), s0);
      w[4 * c + 1] = _mm256_mullo_epi16(hi16u(lo), s0);
      w[4 * c + 2] = _mm256_mullo_epi16(lo16u(hi), s1);
      w[4 * c + 3] = _mm256_mullo_epi16(hi16u(hi), s1);
    }
  }
};

struct DecQ5K {
  static constexpr int kBytes = 176;
  static constexpr bool kHasMin = true;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    uint8_t sc[8];
    k4_head(b, d, dmin, sc, m);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i qhb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const __m256i qh0 = lo16u(qhb), qh1 = hi16u(qhb), one = _mm256_set1_epi16(1);
    auto bit = [&](__m256i qh, int j) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), one), 4); };
    for (int c = 0; c < 4; c++) {
      const __m256i by = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * c));
      const __m256i lo = _mm256_and_si256(by, m4), hi = _mm256_and_si256(_mm256_srli_epi16(by, 4), m4);
      const int j0 = 2 * c, j1 = 2 * c + 1;
      const __m256i s0 = _mm256_set1_epi16(sc[j0]), s1 = _mm256_set1_epi16(sc[j1]);
      w[4 * c + 0] = _mm256_mullo_epi16(_mm256_or_si256(lo16u(lo), bit(qh0, j0)), s0);
      w[4 * c + 1] = _mm256_mullo_epi16(_mm256_or_si256(hi16u(lo), bit(qh1, j0)), s0);
      w[4 * c + 2] = _mm256_mullo_epi16(_mm256_or_si256(lo16u(hi), bit(qh0, j1)), s1);
      w[4 * c + 3] = _mm256_mullo_epi16(_mm256_or_si256(hi16u(hi), bit(qh1, j1)), s1);
    }
  }
};

struct DecQ6K {
  static constexpr int kBytes = 210;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b + 208);
    dmin = 0.f;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), k32 = _mm256_set1_epi16(32);
    for (int h = 0; h < 2; h++) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      for (int k = 0; k < 4; k++) {
        const int j = 4 * h + k;
        const __m256i ql = (k & 1) ? ql1 : ql0;
        const __m256i lo = (k >> 1) ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) : _mm256_and_si256(ql, m4);
        const __m256i hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2), 4);
        const __m256i q = _mm256_or_si256(lo, hb);
        w[2 * j] = _mm256_mullo_epi16(_mm256_sub_epi16(lo16u(q), k32), _mm256_set1_epi16(sc[2 * j]));
        w[2 * j + 1] = _mm256_mullo_epi16(_mm256_sub_epi16(hi16u(q), k32), _mm256_set1_epi16(sc[2 * j + 1]));
      }
    }
  }
};

struct DecIQ2XXS {
  static constexpr int kBytes = 66;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t* q = b + 2 + 8 * ib;
      const uint32_t aux1 = u32_at(q + 4);
      const __m256i g = iq_signed(iq2xxs_grid4(q), aux1);
      const __m256i s = _mm256_set1_epi16((short)(2 * (aux1 >> 28) + 1));
      w[2 * ib] = _mm256_mullo_epi16(lo16s(g), s);
      w[2 * ib + 1] = _mm256_mullo_epi16(hi16s(g), s);
    }
  }
};

struct DecIQ3XXS {
  static constexpr int kBytes = 98;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b) * 0.25f;
    dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t* q = b + 2 + 8 * ib;
      const uint32_t aux = u32_at(b + 66 + 4 * ib);
      const __m256i g = iq_signed(iq3xxs_grid8(q), aux);
      const __m256i s = _mm256_set1_epi16((short)(2 * (aux >> 28) + 1));
      w[2 * ib] = _mm256_mullo_epi16(lo16s(g), s);
      w[2 * ib + 1] = _mm256_mullo_epi16(hi16s(g), s);
    }
  }
};

struct DecQ2K : Q2KBlock {
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b + 80);
    dmin = h2f(b + 82);
    for (int h = 0; h < 2; h++) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * h));
      for (int k = 0; k < 4; k++) {
        const int j = 4 * h + k;
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), _mm256_set1_epi8(3));
        w[2 * j] = _mm256_mullo_epi16(lo16u(q), _mm256_set1_epi16(b[2 * j] & 0xF));
        w[2 * j + 1] = _mm256_mullo_epi16(hi16u(q), _mm256_set1_epi16(b[2 * j + 1] & 0xF));
      }
    }
  }
};

struct DecQ3K {
  static constexpr int kBytes = 110;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b + 108);
    dmin = 0.f;
    int8_t sc[16];
    q3k_scales_simd(b + 96, sc);
    for (int j = 0; j < 8; j++) {
      const __m256i q = q3k_codes(b, j);
      w[2 * j] = _mm256_mullo_epi16(lo16s(q), _mm256_set1_epi16(sc[2 * j]));
      w[2 * j + 1] = _mm256_mullo_epi16(hi16s(q), _mm256_set1_epi16(sc[2 * j + 1]));
    }
  }
};

struct DecIQ4XS {
  static constexpr int kBytes = 136;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b);
    dmin = 0.f;
    const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int ib = 0; ib < 8; ib++) {
      const __m128i by = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 + 16 * ib));
      const __m256i s = _mm256_set1_epi16((short)(iq4xs_scale(b, ib) - 32));
      w[2 * ib] = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(values, _mm_and_si128(by, m4))), s);
      w[2 * ib + 1] = _mm256_mullo_epi16(
          _mm256_cvtepi8_epi16(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(by, 4), m4))), s);
    }
  }
};

// The low-bit grid types (iq_lowbit.cpp), as in the AVX-512 build: per sub-block of 32 values the grid bytes,
// signs (or IQ1's +-1 shifts) and multipliers 2s+1; w[2 ib] holds values 0-15, w[2 ib + 1] values 16-31.
inline __m256i sign_bytes(uint32_t bits) {  // byte v = 0xFF where bit v is set
  const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  return _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);
}
inline void scaled_halves(__m256i g, int lo, int hi, __m256i* w) {  // int8 values -> two words vectors x 2s+1
  w[0] = _mm256_mullo_epi16(lo16s(g), _mm256_set1_epi16((short)lo));
  w[1] = _mm256_mullo_epi16(hi16s(g), _mm256_set1_epi16((short)hi));
}

struct DecIQ2XS {
  static constexpr int kBytes = 74;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const int sc = b[66 + ib];
      scaled_halves(iq2xs_signed(b + 2 + 8 * ib), 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1, w + 2 * ib);
    }
  }
};

struct DecIQ2S {
  static constexpr int kBytes = 82;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const __m256i g = gather4(kIq2sGrid, grid_index4(b + 2 + 4 * ib, b[66 + ib], _mm_setr_epi32(0, 2, 4, 6), 3));
      const int sc = b[74 + ib];
      scaled_halves(apply_signs(g, sign_bytes(u32_at(b + 34 + 4 * ib))), 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1, w + 2 * ib);
    }
  }
};

struct DecIQ3S {
  static constexpr int kBytes = 110;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b);
    dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const __m256i g = iq3s_groups(b, ib);
      const int s = 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15) + 1;
      scaled_halves(apply_signs(g, sign_bytes(u32_at(b + 74 + 4 * ib))), s, s, w + 2 * ib);
    }
  }
};

// IQ1: w = (2s+1) * (8 g + shift) for 16 values from int8 grid bytes g in {-1, 0, 1}.
inline __m256i iq1_shifted(__m128i g, __m256i shift, int mult) {
  return _mm256_mullo_epi16(_mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepi8_epi16(g), 3), shift),
                            _mm256_set1_epi16((short)mult));
}

struct DecIQ1S {
  static constexpr int kBytes = 50;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const int qh = b[34 + 2 * ib] | b[35 + 2 * ib] << 8;
      const __m256i g = gather4(kIq1sGrid, grid_index4(b + 2 + 4 * ib, (uint32_t)qh, _mm_setr_epi32(0, 3, 6, 9), 7));
      const __m128i g01 = _mm256_castsi256_si128(g), g23 = _mm256_extracti128_si256(g, 1);
      const __m256i sh = _mm256_set1_epi16((qh & 0x8000) ? -1 : 1);
      const int mult = 2 * ((qh >> 12) & 7) + 1;
      w[2 * ib] = iq1_shifted(g01, sh, mult);
      w[2 * ib + 1] = iq1_shifted(g23, sh, mult);
    }
  }
};

struct DecIQ1M {
  static constexpr int kBytes = 56;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m256i* w, float& d, float& dmin, uint8_t* m) {
    d = fp16_to_f32(iq1m_d_bits(b)) * 0.125f;
    dmin = 0.f;
    uint16_t sw[4];
    std::memcpy(sw, b + 48, 8);
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t* qs = b + 4 * ib;
      const int h0 = b[32 + 2 * ib], h1 = b[33 + 2 * ib];
      const int n[4] = {h0 & 15, h0 >> 4, h1 & 15, h1 >> 4};
      auto sh = [&](int l) { return (short)((n[l] & 8) ? -1 : 1); };
      const __m256i g = gather4(kIq1sGrid, grid_index4(qs, (uint32_t)(h0 | h1 << 8), _mm_setr_epi32(0, 4, 8, 12), 7));
      const __m128i g01 = _mm256_castsi256_si128(g), g23 = _mm256_extracti128_si256(g, 1);
      const int k = 2 * ib;  // scales k (values 0-15) and k + 1 (16-31)
      const int s0 = (sw[k / 4] >> (3 * (k % 4))) & 7, s1 = (sw[(k + 1) / 4] >> (3 * ((k + 1) % 4))) & 7;
      w[2 * ib] = iq1_shifted(g01, _mm256_set_m128i(_mm_set1_epi16(sh(1)), _mm_set1_epi16(sh(0))), 2 * s0 + 1);
      w[2 * ib + 1] = iq1_shifted(g23, _mm256_set_m128i(_mm_set1_epi16(sh(3)), _mm_set1_epi16(sh(2))), 2 * s1 + 1);
    }
  }
};

// One row's exact lane sums over a decoded block: alo = lanes 0-7 (w[2j]: values 0-15 of sub-block j), ahi = lanes
// 8-15. Always inlined: w stays in registers in rows_kq_t, and is reloaded from the panel in panel_row.
__attribute__((always_inline)) inline void block_sums(const __m256i* w, const int16_t* q, __m256i& alo, __m256i& ahi) {
  alo = _mm256_setzero_si256();
  ahi = _mm256_setzero_si256();
  for (int j = 0; j < 8; j++) {
    alo = _mm256_add_epi32(alo, _mm256_madd_epi16(w[2 * j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j))));
    ahi = _mm256_add_epi32(ahi, _mm256_madd_epi16(w[2 * j + 1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j + 16))));
  }
}

// T is a compile-time constant (the accumulators stay in registers); per output element nothing changes.
template <class Dec, int T>
void rows_kq_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t nb = W.cols / QK_K;
  thread_local std::vector<int16_t> sums16;  // per calling thread, from the shared read-only rows
  if constexpr (HasMins16<Dec>::value) act_sums16(a.q, sums16);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m256 Llo[T], Lhi[T];
    for (int t = 0; t < T; t++) Llo[t] = Lhi[t] = _mm256_setzero_ps();
    __m256 Lm = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      __m256i w[16];
      float d, dmin;
      alignas(16) uint8_t m[8] = {0};
      prefetch_ahead<Dec::kBytes>(row + b * Dec::kBytes);
      Dec::decode(row + b * Dec::kBytes, w, d, dmin, m);
      const int16_t* qb = a.q.q + b * QK_K;
      const float* dx = a.q.d + b * 8;
      for (int t = 0; t < T; t++) {
        const int16_t* q = qb + t * a.q.ldq;
        __m256i alo, ahi;
        block_sums(w, q, alo, ahi);
        const __m256 dd = _mm256_set1_ps(d * dx[t]);
        Llo[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(alo), Llo[t]);
        Lhi[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(ahi), Lhi[t]);
      }
      if constexpr (HasMins16<Dec>::value) {
        // M = sum_s m16[s] * (sum of the 16 activation values of group s), all rows at once (act_sums16)
        alignas(16) int16_t m16[16];
        Dec::mins16(row + b * Dec::kBytes, m16);
        Lm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_loadu_ps(dx)),
                             _mm256_cvtepi32_ps(min_sums16(m16, sums16.data() + b * 128)), Lm);
      } else if constexpr (Dec::kHasMin) {
        Lm = mins_pairs(m, a.q.bsum + b * 64, dmin, dx, Lm);
      }
    }
    alignas(32) float lm[8];
    _mm256_store_ps(lm, Lm);
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(Llo[t], Lhi[t]) - lm[t];
  }
}

template <class Dec>
void rows_kq(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_rows(a.T, [&](auto t) { rows_kq_t<Dec, decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

// Many passes (a prompt window of more than kMaxRowsPerPass rows): kPanelRows weight rows decoded once into a
// panel and multiplied from it into every pass, instead of decoded again for each pass of 8 activation rows (the
// IQ2_XXS / IQ3_XXS gathers, the IQ and K-quant widenings). Each output element receives rows_kq_t's float
// operations in the same order (the decoded registers are stored and reloaded unchanged): bit-identical. Decoders
// with per-16 mins (Q2_K) keep the per-pass path: their activation sums are per pass.
struct alignas(32) PanelBlock {
  __m256i w[16];
  float d, dmin;
  alignas(16) uint8_t m[8];
};
constexpr int64_t kPanelRows = 8;

template <class Dec, int T>
void panel_row(const PanelBlock* pb, int64_t nb, const Act& a, float* y, int64_t ldy, int64_t r) {
  __m256 Llo[T], Lhi[T];
  for (int t = 0; t < T; t++) Llo[t] = Lhi[t] = _mm256_setzero_ps();
  __m256 Lm = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const PanelBlock& B = pb[b];
    const int16_t* qb = a.q.q + b * QK_K;
    const float* dx = a.q.d + b * 8;
    for (int t = 0; t < T; t++) {
      const int16_t* q = qb + t * a.q.ldq;
      __m256i alo, ahi;
      block_sums(B.w, q, alo, ahi);
      const __m256 dd = _mm256_set1_ps(B.d * dx[t]);
      Llo[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(alo), Llo[t]);
      Lhi[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(ahi), Lhi[t]);
    }
    if constexpr (Dec::kHasMin) {
      Lm = mins_pairs(B.m, a.q.bsum + b * 64, B.dmin, dx, Lm);
    }
  }
  alignas(32) float lm[8];
  _mm256_store_ps(lm, Lm);
  for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(Llo[t], Lhi[t]) - lm[t];
}

template <class Dec>
void rows_kq_many(const MatView& W, const Act* pass, int np, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  static_assert(!HasMins16<Dec>::value, "per-16 mins: the per-pass path");
  const int64_t nb = W.cols / QK_K;
  thread_local std::vector<PanelBlock, Align64<PanelBlock>> panel;  // [kPanelRows][nb]
  if ((int64_t)panel.size() < kPanelRows * nb) panel.resize(kPanelRows * nb);
  for (int64_t rb = r0; rb < r1; rb += kPanelRows) {
    const int64_t re = rb + kPanelRows < r1 ? rb + kPanelRows : r1;
    for (int64_t r = rb; r < re; r++) {
      const uint8_t* row = W.data + r * W.row_bytes;
      PanelBlock* pb = panel.data() + (r - rb) * nb;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t* blk = row + b * Dec::kBytes;
        prefetch_ahead<Dec::kBytes>(blk);
        for (int i = 0; i < 8; i++) pb[b].m[i] = 0;  // as rows_kq_t's zeroed m (decoders without mins leave it)
        Dec::decode(blk, pb[b].w, pb[b].d, pb[b].dmin, pb[b].m);
      }
    }
    for (int p = 0; p < np; p++)
      with_rows(pass[p].T, [&](auto t) {
        for (int64_t r = rb; r < re; r++)
          panel_row<Dec, decltype(t)::value>(panel.data() + (r - rb) * nb, nb, pass[p],
                                            y + (int64_t)p * kMaxRowsPerPass * ldy, ldy, r);
      });
  }
}

}  // namespace

// Measured (2048 x 2048, 64 rows, one thread): the panel 8-21 % faster for Q3_K, IQ4_XS and the IQ2/IQ3/IQ1
// types (IQ1_M 12.3 -> 8.2 ms); Q4_K, Q5_K and Q6_K stay on kquants8_avx2.cpp's per-pass 8-bit kernel, which
// was faster there (Q4_K 5.4 against 7.7-8.3 ms).
RowsManyFn rows_many_fn_kq_avx2(uint32_t type) {
  switch (type) {
    case GGML_IQ2_XXS: return rows_kq_many<DecIQ2XXS>;
    case GGML_IQ3_XXS: return rows_kq_many<DecIQ3XXS>;
    case GGML_Q3_K: return rows_kq_many<DecQ3K>;
    case GGML_IQ4_XS: return rows_kq_many<DecIQ4XS>;
    case GGML_IQ2_XS: return rows_kq_many<DecIQ2XS>;
    case GGML_IQ2_S: return rows_kq_many<DecIQ2S>;
    case GGML_IQ3_S: return rows_kq_many<DecIQ3S>;
    case GGML_IQ1_S: return rows_kq_many<DecIQ1S>;
    case GGML_IQ1_M: return rows_kq_many<DecIQ1M>;
    default: return nullptr;
  }
}

RowsFn rows_fn_kq_avx2(uint32_t type) {
  switch (type) {
    case GGML_Q2_K: return rows_kq<DecQ2K>;
    case GGML_Q3_K: return rows_kq<DecQ3K>;
    case GGML_Q4_K: return rows_kq<DecQ4K>;
    case GGML_Q5_K: return rows_kq<DecQ5K>;
    case GGML_Q6_K: return rows_kq<DecQ6K>;
    case GGML_IQ2_XXS: return rows_kq<DecIQ2XXS>;
    case GGML_IQ3_XXS: return rows_kq<DecIQ3XXS>;
    case GGML_IQ4_XS: return rows_kq<DecIQ4XS>;
    case GGML_IQ2_XS: return rows_kq<DecIQ2XS>;
    case GGML_IQ2_S: return rows_kq<DecIQ2S>;
    case GGML_IQ3_S: return rows_kq<DecIQ3S>;
    case GGML_IQ1_S: return rows_kq<DecIQ1S>;
    case GGML_IQ1_M: return rows_kq<DecIQ1M>;
    default: return nullptr;
  }
}

// Same bytes as quantize_act_ref (see quantize_act_avx512); also the int8 copy QAct::q8 that the AVX2 vpmaddubsw
// kernels read (QActBuf::fill_q8's bytes, written here while the values are in registers: fill_q8's separate pass
// was 1.4 % of a 128-token Q4_K prefill at --isa avx2).
void quantize_act_avx2(const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, QAct& out) {
  out = buf.view(T, cols);
  if ((int64_t)buf.q8.size() < T * out.ldq + 32) buf.q8.resize(T * out.ldq + 32);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int t = 0; t < T; t++)
    for (int64_t b = 0; b < out.nb; b++) {
      const float* xb = x + t * ldx + b * QK_K;
      int16_t* qb = buf.q.data() + t * out.ldq + b * QK_K;
      int8_t* q8b = buf.q8.data() + t * out.ldq + b * QK_K;
      __m256 mx = _mm256_setzero_ps();
      for (int i = 0; i < QK_K; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xb + i), absmask));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float amax = _mm_cvtss_f32(m4);
      const __m256 is = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      for (int j = 0; j < 8; j++) {
        __m256i s = _mm256_setzero_si256(), p[2];
        for (int h = 0; h < 2; h++) {
          const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(xb + 32 * j + 16 * h)));
          const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(xb + 32 * j + 16 * h + 8)));
          s = _mm256_add_epi32(s, _mm256_add_epi32(q0, q1));
          // packs interleaves 128-bit halves; permute restores column order
          p[h] = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 32 * j + 16 * h), p[h]);
        }
        // |q| <= 127: packs is the plain narrowing (fill_q8's (int8_t) cast)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8b + 32 * j),
                            _mm256_permute4x64_epi64(_mm256_packs_epi16(p[0], p[1]), 0xD8));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        buf.bsum[(b * 4 + j / 2) * 16 + 2 * t + (j & 1)] = (int16_t)_mm_cvtsi128_si32(s4);
      }
      buf.d[b * 8 + t] = amax / 127.f;
    }
  out.q8 = buf.q8.data();
}

}  // namespace strata
