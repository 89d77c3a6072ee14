// IQ2_XXS and IQ3_XXS with AVX-512 VBMI (byte permutes and multishift), which look the grid and sign tables up in
// registers instead of 64-96 scalar table loads per block: IQ2_XXS's T-row kernel multiplies bytes
// (rows_iq2xxs_bytes_t) and its prompt panels take their bytes from iq2xxs_bytes_vbmi; IQ3_XXS runs
// kquants_avx512.cpp's kernel with a VBMI decoder. Chosen at run time when the CPU has VBMI (and VNNI); the
// integer sums are the ones DecIQ2XXS / DecIQ3XXS give (tested against them and the scalar twin).
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

// An IQ2_XXS block's 32 grid entries (entry j = 4 ib + e: sub-block ib, values 8e .. 8e + 7): word j of codes =
// entry j's 16-bit code word (kGridCodes), byte 8 ib + e of S = its sign-pattern byte (ksigns).
inline void iq2xxs_codes_signs(const uint8_t* b, __m512i* codes, __m512i* S) {
  // the body: qword ib = sub-block ib's four grid indices (bytes 0-3) and its aux word (bytes 4-7)
  const __m512i Z = _mm512_loadu_si512(b + 2);
  // 1. grid entry j: its code from the 256-entry table held in 8 registers
  const __m512i gsel = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       0, 0, 0, 0, 0, 0, 59, 58, 57, 56, 51, 50, 49, 48, 43, 42, 41, 40, 35, 34, 33,
                                       32, 27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
  const __m512i gidx = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(_mm512_permutexvar_epi8(gsel, Z)));
  *codes = lookup256(kGridCodes.data(), gidx);
  // 2. sign patterns: the 7-bit fields of each aux word (bits 32 + 7e of its qword) through ksigns
  const __m512i sctl = _mm512_set1_epi64(0x00000000352E2720LL);  // bytes 32, 39, 46, 53
  const __m512i sidx = _mm512_and_si512(_mm512_multishift_epi64_epi8(sctl, Z), _mm512_set1_epi8(127));
  const __m512i ks0 = _mm512_loadu_si512(kKsigns), ks1 = _mm512_loadu_si512(kKsigns + 64);
  *S = _mm512_permutex2var_epi8(ks0, sidx, ks1);  // qword ib, bytes 0-3: entries 4 ib + e
}

// IQ2_XXS: each pair p of sub-blocks (2p, 2p+1) as their 64 unsigned grid bytes g (sub-block 2p's in bytes
// 0-31), the mask of the negated ones and the two aux words: pair(p, g, neg, a0, a1).
template <class F>
inline void iq2xxs_pairs(const uint8_t* b, F&& pair) {
  __m512i codes, S;
  iq2xxs_codes_signs(b, &codes, &S);
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

// IQ2_XXS in T <= 8 rows (decode steps, verify windows): the unsigned grid bytes g times the
// activation bytes with each weight's sign moved onto its activation (vpmaddubsw: g <= 43, |x| <= 127, a pair
// <= 10922, never saturates), then vpdpwssd with the scale pair (2s+1 of sub-blocks 2p, 2p+1). The activations
// are interleaved once per prepared pass (QAct::il, act8_avx512.h: dword k = values 2k, 2k+1 of sub-block 2p, then of 2p+1), and the
// grid bytes and sign masks are formed directly in that order, so lane k ends with the canonical P[k] of matmul.h
// (an exact integer) and L = fma(d dx, P, L) is rows_kq_t's operation: bit-identical to DecIQ2XXS's kernel (tested
// against the scalar twin). Per 64 weights and row: 6 operations for the weights (4 for the grid bytes, 2 for the
// sign mask) and 3 per row (masked subtract, vpmaddubsw, vpdpwssd), against the widening form's 10 + 2 per row;
// measured (2048 x 2048, one thread, this VM) 190 against 283 us at T = 1, 484 against 561 at T = 8.

struct Iq2ByteCtl {  // the pair-p index vectors of the interleaved order (byte j: dword k = j / 4, h = j % 4 / 2)
  alignas(64) uint16_t cw[4][32];   // qword L <- code words of entries (2p, L / 2), (2p + 1, L / 2), twice
  alignas(64) uint8_t shift[64];    // byte j <- bits 16 h + 2 bb of its qword (bb: byte of the 8-value entry)
  alignas(64) uint8_t sidx[4][64];  // byte j <- S byte of its entry (8 (2p + h) + e)
  alignas(64) uint8_t bit[64];      // byte j <- 1 << bb
};
constexpr Iq2ByteCtl make_iq2_byte_ctl() {
  Iq2ByteCtl c{};
  for (int p = 0; p < 4; p++)
    for (int w = 0; w < 32; w++) c.cw[p][w] = (uint16_t)(8 * p + 4 * (w % 2) + (w / 4) / 2);
  for (int j = 0; j < 64; j++) {
    const int k = j / 4, h = j % 4 / 2, i = j % 2, e = k / 4, bb = 2 * (k % 4) + i;
    c.shift[j] = (uint8_t)(16 * h + 2 * bb);
    c.bit[j] = (uint8_t)(1 << bb);
    for (int p = 0; p < 4; p++) c.sidx[p][j] = (uint8_t)(8 * (2 * p + h) + e);
  }
  return c;
}
constexpr Iq2ByteCtl kIq2ByteCtl = make_iq2_byte_ctl();

template <int T>
void rows_iq2xxs_bytes_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int kBytes = 66;
  const int64_t nb = W.cols / QK_K, cols = a.q.cols;
  STRATA_CHECK(a.q.il && !a.q.il_offset, "IQ2_XXS VBMI kernel: activation rows not interleaved (matmul.cpp interleave_for)");
  const int8_t* xi = a.q.il;
  const Iq2ByteCtl& C = kIq2ByteCtl;
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0x08, 0x19, 0x2b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  const __m512i shift = _mm512_load_si512(C.shift), bit = _mm512_load_si512(C.bit);
  const __m512i three = _mm512_set1_epi8(3), zero = _mm512_setzero_si512();
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m512 L[T];
    for (int t = 0; t < T; t++) L[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* blk = row + b * kBytes;
      prefetch_ahead<kBytes>(blk);
      const float d = h2f(blk) * 0.125f;
      __m512i codes, S;
      iq2xxs_codes_signs(blk, &codes, &S);
      __m512i g[4], s2[4];
      __mmask64 neg[4];
      for (int p = 0; p < 4; p++) {
        const __m512i cw = _mm512_permutexvar_epi16(_mm512_load_si512(C.cw[p]), codes);
        g[p] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_multishift_epi64_epi8(shift, cw), three));
        neg[p] = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(_mm512_load_si512(C.sidx[p]), S), bit);
        s2[p] = _mm512_set1_epi32((int32_t)(2 * (u32_at(blk + 2 + 16 * p + 4) >> 28) + 1) |
                                  (int32_t)(2 * (u32_at(blk + 2 + 16 * p + 12) >> 28) + 1) << 16);
      }
      const float* dx = a.q.d + b * 8;
      for (int t = 0; t < T; t++) {
        const int8_t* q = xi + t * cols + b * QK_K;
        __m512i acc = zero;
        for (int p = 0; p < 4; p++) {
          const __m512i x = _mm512_load_si512(q + 64 * p);
          const __m512i pr = _mm512_maddubs_epi16(g[p], _mm512_mask_sub_epi8(x, neg[p], zero, x));
          acc = p == 0 ? _mm512_madd_epi16(pr, s2[p]) : _mm512_dpwssd_epi32(acc, pr, s2[p]);
        }
        L[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * dx[t]), _mm512_cvtepi32_ps(acc), L[t]);
      }
    }
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(L[t]);
  }
}

void rows_iq2xxs_vbmi(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_rows(a.T, [&](auto t) { rows_iq2xxs_bytes_t<decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

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
    case GGML_IQ2_XXS: return rows_iq2xxs_vbmi;  // vbmi_kernels_on(): VNNI too
    case GGML_IQ3_XXS: return pick<DecIQ3XXSVbmi>();
    default: return nullptr;
  }
}

RowsManyFn rows_many_fn_kq_avx512vbmi(uint32_t type) {
  switch (type) {
    // IQ2_XXS: rows_many_fn_kq8_avx512's byte panels (their decode: iq2xxs_bytes_vbmi)
    case GGML_IQ3_XXS: return pick_many<DecIQ3XXSVbmi>();
    default: return nullptr;
  }
}

}  // namespace strata
