// Shared by the int8-activation SIMD kernels: block facts and tables (the IQ sign masks, the Q4_K/Q5_K scale
// unpacking), and AVX2-level helpers (marked) that only the ISA translation units call (Q2_K mins, the low-bit IQ
// grid lookups).
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/iq_tables.h"
#include "kernels/quants.h"
#include <immintrin.h>

#include "util/common.h"

namespace strata {
extern bool g_gathers;  // matmul.cpp
}  // namespace strata

namespace strata::kq {

// kSignMask[i] byte j = 0xFF where bit j of ksigns[i] is set: (g ^ m) - m negates exactly those bytes.
constexpr std::array<uint64_t, 128> make_sign_masks() {
  std::array<uint64_t, 128> t{};
  for (int i = 0; i < 128; i++)
    for (int j = 0; j < 8; j++)
      if ((kKsigns[i] >> j) & 1) t[i] |= (uint64_t)0xFF << (8 * j);
  return t;
}
alignas(64) inline constexpr std::array<uint64_t, 128> kSignMask = make_sign_masks();
// The same signs as +-1 bytes (0x01 / 0xFF), for vpsignb on the activations.
constexpr std::array<uint64_t, 128> make_sign_pm() {
  std::array<uint64_t, 128> t = make_sign_masks();
  for (auto& v : t) v |= 0x0101010101010101ull;
  return t;
}
alignas(64) inline constexpr std::array<uint64_t, 128> kSignPm = make_sign_pm();

// A decoder whose mins are per 16 values (Q2_K) says kMins16 = true and provides mins16(block, int16_t[16]);
// the kernels then form M = sum_v m16[v / 16] * q[v] from the activation values (bsum is per 32).
// Sums of 16 activation values per (block, 16-value group, row), laid out for the min sums of Q2_K:
// out[((b * 8 + s / 2) * 8 + t) * 2 + s % 2] for group s, rows t < T (0 for t >= T). |sum| <= 16 * 127.
inline void act_sums16(const QAct& a, std::vector<int16_t>& out) {
  out.assign((size_t)a.nb * 128, 0);
  for (int64_t b = 0; b < a.nb; b++)
    for (int t = 0; t < a.T; t++) {
      const int16_t* q = a.q + t * a.ldq + b * QK_K;
      for (int s = 0; s < 16; s++) {
        int sum = 0;
        for (int i = 0; i < 16; i++) sum += q[16 * s + i];
        out[((b * 8 + s / 2) * 8 + t) * 2 + s % 2] = (int16_t)sum;
      }
    }
}

// Only for the ISA translation units (AVX2 and up): M of every row (lane t) of one block from its 16 mins and
// that block's 128 act_sums16 values.
inline __m256i min_sums16(const int16_t* m16, const int16_t* bs) {
  __m256i M = _mm256_setzero_si256();
  for (int p = 0; p < 8; p++) {  // mins 2p, 2p+1 as one int32 (little-endian int16 pair), against rows' sums
    int32_t pair;
    std::memcpy(&pair, m16 + 2 * p, 4);
    M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + 16 * p)),
                                              _mm256_set1_epi32(pair)));
  }
  return M;
}

// Only for the ISA translation units (AVX2 and up), shared by the low-bit IQ decoders:
// grid entries of 4 groups, idx_l = lo8[l] | ((hi >> shift_l) & mask) << 8, looked up by one gather;
inline __m128i grid_index4(const uint8_t* lo8, uint32_t hi, __m128i shifts, int mask) {
  uint32_t lo;
  std::memcpy(&lo, lo8, 4);
  const __m128i h = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)hi), shifts), _mm_set1_epi32(mask));
  return _mm_or_si128(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)lo)), _mm_slli_epi32(h, 8));
}
inline __m256i gather4(const uint64_t* table, __m128i idx) {
  return _mm256_i32gather_epi64(reinterpret_cast<const long long*>(table), idx, 8);
}
// Whether the AVX2 IQ kernels look up grid rows by vector gathers (matmul.cpp g_gathers: on Intel cores, where one
// gather per sub-block measured T = 1 IQ2_XXS 488 -> 226 us, the note in kquants8_avx2.cpp) or by scalar table
// loads (elsewhere: on AMD Zen 4 the gathers were the slow part, IQ2_XXS decode 0.85x llama.cpp's AVX2 build, which
// loads the grid rows one by one). The same bytes either way (tested both ways: prefer_gathers).
// IQ2_XXS: the grid rows of the four index bytes at q (one sub-block's 32 unsigned grid bytes).
inline __m256i iq2xxs_grid4(const uint8_t* q) {
  if (g_gathers) return gather4(kIq2xxsGrid, _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)u32_at(q))));
  // (the index bytes taken from one load in a register: byte loads of each would add four loads to the sixteen-odd
  // of a sub-block, the load ports being what bounds these kernels on AMD Zen 3)
  const uint32_t v = u32_at(q);
  return _mm256_set_epi64x((long long)kIq2xxsGrid[v >> 24], (long long)kIq2xxsGrid[(v >> 16) & 255],
                           (long long)kIq2xxsGrid[(v >> 8) & 255], (long long)kIq2xxsGrid[v & 255]);
}
// IQ3_XXS: the grid dwords of the eight index bytes at q.
inline __m256i iq3xxs_grid8(const uint8_t* q) {
  if (g_gathers)
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(kIq3xxsGrid),
                                  _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))), 4);
  const uint32_t v = u32_at(q), w = u32_at(q + 4);  // (index bytes from registers, as iq2xxs_grid4)
  return _mm256_setr_epi32((int)kIq3xxsGrid[v & 255], (int)kIq3xxsGrid[(v >> 8) & 255], (int)kIq3xxsGrid[(v >> 16) & 255],
                           (int)kIq3xxsGrid[v >> 24], (int)kIq3xxsGrid[w & 255], (int)kIq3xxsGrid[(w >> 8) & 255],
                           (int)kIq3xxsGrid[(w >> 16) & 255], (int)kIq3xxsGrid[w >> 24]);
}
// IQ3_S's eight groups of sub-block ib (grid index: qs byte | bit l of qh[ib] << 8): their grid bytes, by one gather.
inline __m256i iq3s_groups(const uint8_t* b, int ib) {
  const __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[66 + ib]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                                      _mm256_set1_epi32(1));
  const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * ib))),
                                      _mm256_slli_epi32(hb, 8));
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(kIq3sGrid), idx, 4);
}
// g's bytes negated where m's bytes are 0xFF.
inline __m256i apply_signs(__m256i g, __m256i m) { return _mm256_sub_epi8(_mm256_xor_si256(g, m), m); }
// IQ2_XXS / IQ3_XXS: the four 7-bit ksigns indices of `signs` (bits 0-27) sign four groups of 8 bytes of g.
inline __m256i iq_signed(__m256i g, uint32_t signs) {
  const __m256i sm = _mm256_set_epi64x((long long)kSignMask[(signs >> 21) & 127], (long long)kSignMask[(signs >> 14) & 127],
                                       (long long)kSignMask[(signs >> 7) & 127], (long long)kSignMask[signs & 127]);
  return apply_signs(g, sm);
}
// IQ2_XS's four groups of a sub-block (4 u16 at q16: grid index 9 bits, ksigns index 7 bits): the signed grid
// bytes (scalar lookups: two gathers per 4 groups, grid and signs, measured 40 % slower here).
inline __m256i iq2xs_signed(const uint8_t* q16) {
  uint16_t q[4];
  std::memcpy(q, q16, 8);
  const __m256i g = _mm256_set_epi64x((long long)kIq2xsGrid[q[3] & 511], (long long)kIq2xsGrid[q[2] & 511],
                                      (long long)kIq2xsGrid[q[1] & 511], (long long)kIq2xsGrid[q[0] & 511]);
  const __m256i sm = _mm256_set_epi64x((long long)kSignMask[q[3] >> 9], (long long)kSignMask[q[2] >> 9],
                                       (long long)kSignMask[q[1] >> 9], (long long)kSignMask[q[0] >> 9]);
  return apply_signs(g, sm);
}

// What the AVX2 and AVX-512 Q2_K decoders share: the block size and the mins per 16 values.
struct Q2KBlock {
  static constexpr int kBytes = 84;
  static constexpr bool kHasMin = true;
  static constexpr bool kMins16 = true;
  static inline void mins16(const uint8_t* b, int16_t* m) {  // the high nibbles of the 16 scale bytes
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(m),
                        _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(0x0F))));
  }
};

template <class D, class = void>
struct HasMins16 : std::false_type {};
template <class D>
struct HasMins16<D, std::void_t<decltype(D::kMins16)>> : std::bool_constant<D::kMins16> {};

// Q4_K/Q5_K scales and mins, branch-free (ggml's kmask trick): sc[0..7] and m[0..7] as bytes.
inline void k4_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  const uint32_t sc_lo = u[0] & k1, m_lo = u[1] & k1;
  const uint32_t sc_hi = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  std::memcpy(sc, &sc_lo, 4);
  std::memcpy(sc + 4, &sc_hi, 4);
  std::memcpy(m, &m_lo, 4);
  std::memcpy(m + 4, &m_hi, 4);
}

// Only for the ISA translation units (which are built with F16C): an fp16 scale.
inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
// Only for the ISA translation units (AVX2 and up): quants.h q3k_scales in a few vector operations.
inline void q3k_scales_simd(const uint8_t* sc12, int8_t* out) {
  const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc12)), m4 = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
  const uint32_t h = u32_at(sc12 + 8), m2 = 0x03030303u;
  const __m128i hi = _mm_setr_epi32((int)(h & m2), (int)((h >> 2) & m2), (int)((h >> 4) & m2), (int)((h >> 6) & m2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32)));
}
// Only for the ISA translation units (AVX2 and up): the 32 codes (-4..3, int8) of Q3_K values 32 j .. 32 j + 31,
// bits 2 (j % 4) of qs[32 (j / 4) + l] and bit j of hmask[l] (quants.h q3k_code).
inline __m256i q3k_codes(const uint8_t* b, int j) {
  const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 + 32 * (j / 4)));
  const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i ql = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * (j % 4)), _mm256_set1_epi8(3));
  const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, j), _mm256_set1_epi8(1));
  return _mm256_sub_epi8(ql, _mm256_andnot_si256(_mm256_slli_epi16(hb, 2), _mm256_set1_epi8(4)));  // hb ? 0 : 4
}
// Only for the ISA translation units (AVX2 and up): the Q4_K/Q5_K block header in vector registers, the same
// values as k4_head: ddm = [d, dmin, ...], sc16 / m16 = the eight 6-bit scales / mins as int16 words (k4_scales'
// bit layout done on the three header dwords at once; the scalar version and its byte reloads cost about half of
// a T = 1 Q4_K product).
inline void k4_head_simd(const uint8_t* b, __m128& ddm, __m128i& sc16, __m128i& m16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));  // d, dmin, 12 scale bytes
  ddm = _mm_cvtph_ps(h);
  const __m128i u = _mm_srli_si128(h, 4);                                   // [u0, u1, u2, 0]
  const __m128i a = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 2, 1, 0));          // [u0, u1, u2, u2]
  const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                   _mm_setr_epi32(0x3f3f3f3f, 0x3f3f3f3f, 0x0f0f0f0f, 0x0f0f0f0f));
  // ((x >> 6) & 0x03030303) << 4 == (x >> 2) & 0x30303030, for the high halves only
  const __m128i c = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 1, 0));          // [u0, u1, u0, u1]
  const __m128i hi = _mm_and_si128(_mm_srli_epi32(c, 2), _mm_setr_epi32(0, 0, 0x30303030, 0x30303030));
  const __m128i r = _mm_shuffle_epi32(_mm_or_si128(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));  // [sc_lo, sc_hi, m_lo, m_hi]
  sc16 = _mm_cvtepu8_epi16(r);
  m16 = _mm_cvtepu8_epi16(_mm_srli_si128(r, 8));
}
// Software prefetch of the weight block kAheadBytes ahead of blk (a matrix's rows are contiguous, so this runs
// into the next rows): the bytes of one block, so that each line is asked for about once. The hardware
// prefetcher alone left the T = 1 K-quant kernels waiting on DRAM: on this Xeon a 1 KB distance took a
// qwen35moe bench Q4_K decode step (1 thread) from 36.3 to 27.8 ms, 2 KB to 26.4 ms (512 B: 30.1 ms); the
// block after next (the old distance) is too close for DRAM latency.
constexpr int kAheadBytes = 2048;
// d * dx[t] for the 8 rows of a pass (dx: a pass's 8 row scales of one block), stored and read back from memory so
// that each row's factor is the fma's own broadcast operand ({1to16}) instead of a scalar multiply and a shuffle
// port's register broadcast beside the multiplies (the AVX-512 panels: 4k prefill +1.7 %, docs/BENCHMARKS.md
// session 34). The same float product d * dx[t], so the same bits; lanes past a pass's T read as mins_fma does.
struct RowFactors {
  alignas(32) float v[8];
  RowFactors(float d, const float* dx) {
    _mm256_store_ps(v, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_loadu_ps(dx)));
    __asm__("" : "+m"(v));  // read back from memory: else the compiler broadcasts the register's lanes (shuffles)
  }
  float operator[](int t) const { return v[t]; }
};

template <int kBytes>
inline void prefetch_ahead(const uint8_t* blk) {
  for (int o = 0; o < kBytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(blk + kAheadBytes + o), _MM_HINT_T0);
}
// The Q4_K/Q5_K block header: d, dmin, and the eight 6-bit scales and mins.
inline void k4_head(const uint8_t* b, float& d, float& dmin, uint8_t* sc, uint8_t* m) {
  d = h2f(b);
  dmin = h2f(b + 2);
  k4_scales(b + 4, sc, m);
}

// AVX2-level: dword p of v (int16 pairs) in every lane.
inline __m256i pair_dword(__m128i v, int p) {
  return _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(v), _mm256_set1_epi32(p));
}
// The mins term of a Q4_K/Q5_K block (its 6-bit mins as the int16 words m16) for up to 8 rows at once, M = sum over
// the pairs of sub-blocks of (m[2p], m[2p+1]) . bsum (quants.h [pair][row][2]; lane t = row t), then
// Lm = fma(dmin * dx, M, Lm).
inline __m256 mins_words(__m128i m16, const int16_t* bs, float dmin, const float* dx, __m256 Lm) {
  __m256i M = _mm256_setzero_si256();
  for (int p = 0; p < 4; p++)
    M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + 16 * p)),
                                              pair_dword(m16, p)));
  return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(M), Lm);
}
// The same from the mins as bytes m[8].
inline __m256 mins_pairs(const uint8_t* m, const int16_t* bs, float dmin, const float* dx, __m256 Lm) {
  return mins_words(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))), bs, dmin, dx, Lm);
}

#if defined(__AVX512F__)
// Only for the AVX-512 translation units: the mins term of a Q4_K/Q5_K block for up to 8 rows at once,
// M = sum_j m[j] * bsum[j] (m16: the mins as words; bs: the block's activation sums, quants.h [pair of
// sub-blocks][row][2]; lane t = row t), then Lm = fma(dmin * dx, M, Lm), as every kernel of those types does.
inline __m256 mins_fma(__m128i m16, const int16_t* bs, float dmin, const float* dx, __m256 Lm) {
  const __m512i idx01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i idx23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i mz = _mm512_castsi128_si512(m16);
  const __m512i M16 = _mm512_add_epi32(_mm512_madd_epi16(_mm512_loadu_si512(bs), _mm512_permutexvar_epi32(idx01, mz)),
                                       _mm512_madd_epi16(_mm512_loadu_si512(bs + 32), _mm512_permutexvar_epi32(idx23, mz)));
  const __m256i M8 = _mm256_add_epi32(_mm512_castsi512_si256(M16), _mm512_extracti64x4_epi64(M16, 1));
  return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(M8), Lm);
}
#endif

}  // namespace strata::kq
