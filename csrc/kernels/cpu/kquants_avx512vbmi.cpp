// IQ2_XXS and IQ3_XXS with AVX-512 VBMI (byte permutes and multishift): the same kernel as kquants_avx512.cpp,
// with decoders that look the grid and sign tables up in registers instead of 64-96 scalar table loads per
// block. Chosen at run time when the CPU has VBMI; the integer weights w[j] are the ones DecIQ2XXS /
// DecIQ3XXS produce (tested against them and the scalar twin).
#include <immintrin.h>

#include <array>

#include "kernels/cpu/kquants_avx512_impl.h"

namespace strata {

namespace {

// Each grid entry's 8 bytes are among {0x08, 0x19, 0x2b}: code k of entry i (bits 2k..2k+1) says which.
constexpr std::array<uint16_t, 256> make_grid_codes() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; i++)
    for (int k = 0; k < 8; k++) {
      const uint8_t v = (uint8_t)(kIq2xxsGrid[i] >> (8 * k));
      const int c = v == 0x08 ? 0 : v == 0x19 ? 1 : v == 0x2b ? 2 : -1;
      if (c < 0) throw "iq2xxs grid byte outside {0x08, 0x19, 0x2b}";  // fails the constant evaluation
      t[i] |= (uint16_t)(c << (2 * k));
    }
  return t;
}
alignas(64) constexpr std::array<uint16_t, 256> kGridCodes = make_grid_codes();

// IQ3_XXS: each grid entry's 4 bytes are among {4, 12, 20, 28, 36, 44, 52, 62}: code k (bits 3k..3k+2).
constexpr uint8_t kIq3Values[8] = {4, 12, 20, 28, 36, 44, 52, 62};
constexpr std::array<uint16_t, 256> make_grid3_codes() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; i++)
    for (int k = 0; k < 4; k++) {
      const uint8_t v = (uint8_t)(kIq3xxsGrid[i] >> (8 * k));
      int c = -1;
      for (int j = 0; j < 8; j++)
        if (kIq3Values[j] == v) c = j;
      if (c < 0) throw "iq3xxs grid byte outside the 8 values";  // fails the constant evaluation
      t[i] |= (uint16_t)(c << (3 * k));
    }
  return t;
}
alignas(64) constexpr std::array<uint16_t, 256> kGrid3Codes = make_grid3_codes();

// 32 byte indices (zero-extended to words) -> their 16-bit codes from a 256-entry table held in 8 registers
inline __m512i lookup256(const uint16_t* table, __m512i idx) {
  const __m512i* tab = reinterpret_cast<const __m512i*>(table);
  const __m512i r0 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 0), idx, _mm512_load_si512(tab + 1));
  const __m512i r1 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 2), idx, _mm512_load_si512(tab + 3));
  const __m512i r2 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 4), idx, _mm512_load_si512(tab + 5));
  const __m512i r3 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 6), idx, _mm512_load_si512(tab + 7));
  const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
  const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
  return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
}

// 8 sign-pattern bytes (S bytes first..first+7, one per 8 weights) -> a mask over 64 weights
inline __mmask64 sign_mask(__m512i S, int first) {
  const __m512i rep = _mm512_add_epi8(_mm512_set1_epi8((char)first),
                                      _mm512_set_epi64(0x0707070707070707LL, 0x0606060606060606LL, 0x0505050505050505LL,
                                                       0x0404040404040404LL, 0x0303030303030303LL, 0x0202020202020202LL,
                                                       0x0101010101010101LL, 0));
  return _mm512_test_epi8_mask(_mm512_permutexvar_epi8(rep, S), _mm512_set1_epi64(0x8040201008040201LL));
}

// Two sub-blocks' 64 grid bytes g, negated where neg says, times each sub-block's scale 2 * (aux >> 28) + 1
// (a0: the first's aux word, a1: the second's) -> their int16 weights w[0], w[1].
inline void signed_scaled_pair(__m512i g, __mmask64 neg, uint32_t a0, uint32_t a1, __m512i* w) {
  const __m512i x = _mm512_mask_sub_epi8(g, neg, _mm512_setzero_si512(), g);
  w[0] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(x)), _mm512_set1_epi16((short)(2 * (a0 >> 28) + 1)));
  w[1] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(x, 1)),
                            _mm512_set1_epi16((short)(2 * (a1 >> 28) + 1)));
}

// IQ2_XXS: each pair p of sub-blocks (2p, 2p+1) as their 64 unsigned grid bytes g (sub-block 2p's in bytes
// 0-31), the mask of the negated ones and the two aux words: pair(p, g, neg, a0, a1).
template <class F>
inline void iq2xxs_pairs(const uint8_t* b, F&& pair) {
  // the body: qword ib = sub-block ib's four grid indices (bytes 0-3) and its aux word (bytes 4-7)
  const __m512i Z = _mm512_loadu_si512(b + 2);
  // 1. grid entry j = 4 ib + e: its 16-bit code from the 256-entry table held in 8 registers
  const __m512i gsel = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       0, 0, 0, 0, 0, 0, 59, 58, 57, 56, 51, 50, 49, 48, 43, 42, 41, 40, 35, 34, 33,
                                       32, 27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
  const __m512i gidx = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(_mm512_permutexvar_epi8(gsel, Z)));
  const __m512i codes = lookup256(kGridCodes.data(), gidx);
  // 2. sign patterns: the 7-bit fields of each aux word (bits 32 + 7e of its qword) through ksigns
  const __m512i sctl = _mm512_set1_epi64(0x00000000352E2720LL);  // bytes 32, 39, 46, 53
  const __m512i sidx = _mm512_and_si512(_mm512_multishift_epi64_epi8(sctl, Z), _mm512_set1_epi8(127));
  const __m512i ks0 = _mm512_loadu_si512(kKsigns), ks1 = _mm512_loadu_si512(kKsigns + 64);
  const __m512i S = _mm512_permutex2var_epi8(ks0, sidx, ks1);  // qword ib, bytes 0-3: entries 4 ib + e
  // 3. per pair of sub-blocks (8 entries, 64 weights): bytes from the codes, signs as a byte mask
  const __m512i shift = _mm512_set1_epi64(0x0E0C0A0806040200LL);  // byte k <- bits 2k.. of its qword
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0x08, 0x19, 0x2b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  for (int p = 0; p < 4; p++) {
    // qword L <- code word of entry 8p + L; byte 8L + k <- sign pattern byte of entry 8p + L
    const __m512i cw = _mm512_permutexvar_epi16(
        _mm512_set_epi16(8 * p + 7, 8 * p + 7, 8 * p + 7, 8 * p + 7, 8 * p + 6, 8 * p + 6, 8 * p + 6, 8 * p + 6,
                         8 * p + 5, 8 * p + 5, 8 * p + 5, 8 * p + 5, 8 * p + 4, 8 * p + 4, 8 * p + 4, 8 * p + 4,
                         8 * p + 3, 8 * p + 3, 8 * p + 3, 8 * p + 3, 8 * p + 2, 8 * p + 2, 8 * p + 2, 8 * p + 2,
                         8 * p + 1, 8 * p + 1, 8 * p + 1, 8 * p + 1, 8 * p, 8 * p, 8 * p, 8 * p),
        codes);
    const __m512i g = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_multishift_epi64_epi8(shift, cw),
                                                                _mm512_set1_epi8(3)));
    // sub-block 2p's four pattern bytes sit at S bytes 16p.., 2p + 1's at 16p + 8..: gather them to 8 in a row
    const __m512i S8 = _mm512_permutexvar_epi8(
        _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (char)(16 * p + 11),
                        (char)(16 * p + 10), (char)(16 * p + 9), (char)(16 * p + 8), (char)(16 * p + 3),
                        (char)(16 * p + 2), (char)(16 * p + 1), (char)(16 * p)),
        S);
    pair(p, g, sign_mask(S8, 0), u32_at(b + 2 + 16 * p + 4), u32_at(b + 2 + 16 * p + 12));
  }
}

struct DecIQ2XXSVbmi {
  static constexpr int kBytes = 66;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    iq2xxs_pairs(b, [&](int p, __m512i g, __mmask64 neg, uint32_t a0, uint32_t a1) {
      signed_scaled_pair(g, neg, a0, a1, w + 2 * p);
    });
  }
};

struct DecIQ3XXSVbmi {
  static constexpr int kBytes = 98;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.25f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    // grid indices: sub-block ib's eight at bytes 8 ib.. of the first 64; aux words (8 x u32) after them
    const __m512i Z = _mm512_loadu_si512(b + 2);
    const __m512i codes_lo = lookup256(kGrid3Codes.data(), _mm512_cvtepu8_epi16(_mm512_castsi512_si256(Z)));
    const __m512i codes_hi = lookup256(kGrid3Codes.data(), _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(Z, 1)));
    // sign patterns: qword m holds the aux words of sub-blocks 2m, 2m+1; their 7-bit fields through ksigns,
    // so that S byte 4 sb + e is sub-block sb's pattern e (weights 8e .. 8e + 7)
    const __m512i A = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 66)));
    const __m512i sidx = _mm512_and_si512(_mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720150E0700LL), A),
                                          _mm512_set1_epi8(127));
    const __m512i S = _mm512_permutex2var_epi8(_mm512_loadu_si512(kKsigns), sidx, _mm512_loadu_si512(kKsigns + 64));
    const __m512i shift = _mm512_set1_epi64(0x2926232009060300LL);  // bytes 0, 3, 6, 9 | 32, 35, 38, 41
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(4, 12, 20, 28, 36, 44, 52, 62, 0, 0, 0, 0, 0, 0, 0, 0));
    for (int p = 0; p < 4; p++) {
      // dword i (entry i of sub-blocks 2p, 2p+1) <- its code word, twice
      const __m512i codes = p < 2 ? codes_lo : codes_hi;
      const short o = (short)(16 * (p & 1));
      const __m512i cw = _mm512_permutexvar_epi16(
          _mm512_set_epi16(o + 15, o + 15, o + 14, o + 14, o + 13, o + 13, o + 12, o + 12, o + 11, o + 11, o + 10, o + 10,
                           o + 9, o + 9, o + 8, o + 8, o + 7, o + 7, o + 6, o + 6, o + 5, o + 5, o + 4, o + 4, o + 3,
                           o + 3, o + 2, o + 2, o + 1, o + 1, o, o),
          codes);
      const __m512i g = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_multishift_epi64_epi8(shift, cw),
                                                                  _mm512_set1_epi8(7)));
      signed_scaled_pair(g, sign_mask(S, 8 * p), u32_at(b + 66 + 8 * p), u32_at(b + 66 + 8 * p + 4), w + 2 * p);
    }
  }
};

}  // namespace

void iq2xxs_bytes_vbmi(const uint8_t* b, __m512i* w, int32_t* s2) {
  // word k of sub-block 2p's bytes, then word k of 2p+1's: dword k = pair k of each (kquants8_avx512.cpp)
  const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                      20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  iq2xxs_pairs(b, [&](int p, __m512i g, __mmask64 neg, uint32_t a0, uint32_t a1) {
    w[p] = _mm512_permutexvar_epi16(il, _mm512_mask_sub_epi8(g, neg, _mm512_setzero_si512(), g));
    s2[p] = (int32_t)(2 * (a0 >> 28) + 1) | (int32_t)(2 * (a1 >> 28) + 1) << 16;
  });
}

RowsFn rows_fn_kq_avx512vbmi(uint32_t type) {
  switch (type) {
    case GGML_IQ2_XXS: return pick<DecIQ2XXSVbmi>();
    case GGML_IQ3_XXS: return pick<DecIQ3XXSVbmi>();
    default: return nullptr;
  }
}

RowsManyFn rows_many_fn_kq_avx512vbmi(uint32_t type) {
  switch (type) {
    case GGML_IQ2_XXS: return pick_many<DecIQ2XXSVbmi>();
    case GGML_IQ3_XXS: return pick_many<DecIQ3XXSVbmi>();
    default: return nullptr;
  }
}

}  // namespace strata
