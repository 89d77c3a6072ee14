// IQ2_XXS with AVX-512 VBMI (byte permutes and multishift): the same kernel as kquants_avx512.cpp, with a
// decoder that looks the grid and sign tables up in registers instead of 64 scalar table loads per block.
// Chosen at run time when the CPU has VBMI; the integer weights w[j] are the ones DecIQ2XXS produces
// (tested against the scalar twin).
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

struct DecIQ2XXSVbmi {
  static constexpr int kBytes = 66;
  static constexpr bool kHasMin = false;
  static inline void decode(const uint8_t* b, __m512i* w, float& d, float& dmin, __m128i& mins) {
    d = h2f(b) * 0.125f;
    dmin = 0.f;
    mins = _mm_setzero_si128();
    // the body: qword ib = sub-block ib's four grid indices (bytes 0-3) and its aux word (bytes 4-7)
    const __m512i Z = _mm512_loadu_si512(b + 2);
    // 1. grid entry j = 4 ib + e: its 16-bit code from the 256-entry table held in 8 registers
    const __m512i gsel = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0, 59, 58, 57, 56, 51, 50, 49, 48, 43, 42, 41, 40, 35, 34, 33,
                                         32, 27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
    const __m512i gidx = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(_mm512_permutexvar_epi8(gsel, Z)));
    const __m512i* tab = reinterpret_cast<const __m512i*>(kGridCodes.data());
    const __m512i r0 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 0), gidx, _mm512_load_si512(tab + 1));
    const __m512i r1 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 2), gidx, _mm512_load_si512(tab + 3));
    const __m512i r2 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 4), gidx, _mm512_load_si512(tab + 5));
    const __m512i r3 = _mm512_permutex2var_epi16(_mm512_load_si512(tab + 6), gidx, _mm512_load_si512(tab + 7));
    const __mmask32 b6 = _mm512_test_epi16_mask(gidx, _mm512_set1_epi16(64));
    const __mmask32 b7 = _mm512_test_epi16_mask(gidx, _mm512_set1_epi16(128));
    const __m512i codes = _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
    // 2. sign patterns: the 7-bit fields of each aux word (bits 32 + 7e of its qword) through ksigns
    const __m512i sctl = _mm512_set1_epi64(0x00000000352E2720LL);  // bytes 32, 39, 46, 53
    const __m512i sidx = _mm512_and_si512(_mm512_multishift_epi64_epi8(sctl, Z), _mm512_set1_epi8(127));
    const __m512i ks0 = _mm512_loadu_si512(kKsigns), ks1 = _mm512_loadu_si512(kKsigns + 64);
    const __m512i S = _mm512_permutex2var_epi8(ks0, sidx, ks1);  // qword ib, bytes 0-3: entries 4 ib + e
    // 3. per pair of sub-blocks (8 entries, 64 weights): bytes from the codes, signs as a byte mask
    const __m512i shift = _mm512_set1_epi64(0x0E0C0A0806040200LL);  // byte k <- bits 2k.. of its qword
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0x08, 0x19, 0x2b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m512i bit = _mm512_set1_epi64(0x8040201008040201LL);
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
      const char s0 = (char)(16 * p), s1 = (char)(16 * p + 8);  // sub-block 2p's patterns, then 2p + 1's
      const __m512i sp = _mm512_permutexvar_epi8(
          _mm512_set_epi8(s1 + 3, s1 + 3, s1 + 3, s1 + 3, s1 + 3, s1 + 3, s1 + 3, s1 + 3, s1 + 2, s1 + 2, s1 + 2, s1 + 2,
                          s1 + 2, s1 + 2, s1 + 2, s1 + 2, s1 + 1, s1 + 1, s1 + 1, s1 + 1, s1 + 1, s1 + 1, s1 + 1, s1 + 1,
                          s1, s1, s1, s1, s1, s1, s1, s1, s0 + 3, s0 + 3, s0 + 3, s0 + 3, s0 + 3, s0 + 3, s0 + 3,
                          s0 + 3, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 1, s0 + 1,
                          s0 + 1, s0 + 1, s0 + 1, s0 + 1, s0 + 1, s0 + 1, s0, s0, s0, s0, s0, s0, s0, s0),
          S);
      const __mmask64 neg = _mm512_test_epi8_mask(sp, bit);
      const __m512i x = _mm512_mask_sub_epi8(g, neg, _mm512_setzero_si512(), g);
      const uint32_t a0 = u32_at(b + 2 + 16 * p + 4), a1 = u32_at(b + 2 + 16 * p + 12);
      w[2 * p] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(x)),
                                    _mm512_set1_epi16((short)(2 * (a0 >> 28) + 1)));
      w[2 * p + 1] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(x, 1)),
                                        _mm512_set1_epi16((short)(2 * (a1 >> 28) + 1)));
    }
  }
};

}  // namespace

RowsFn rows_fn_kq_avx512vbmi(uint32_t type) { return type == GGML_IQ2_XXS ? pick<DecIQ2XXSVbmi>() : nullptr; }

}  // namespace strata
