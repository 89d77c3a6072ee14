// AVX2 int8-activation kernels that multiply 8-bit weights by 8-bit activations (vpmaddubsw) for Q4_K, Q5_K,
// Q6_K, IQ2_XXS, IQ3_XXS and IQ4_XS, where kquants_avx2.cpp's kernel spends much of its time widening every
// weight to 16 bits and multiplying in its scale (Q4_K at T = 1: 194 -> 150 us for 1024 x 2048, T = 8: 760 ->
// 460 us, one thread). Each decoder's kMaxT is the longest window that takes this path; longer windows of the
// signed types (per-row sign operations) the widening kernel, whose decode more rows share. The IQ2_XXS and
// IQ3_XXS grid rows come from one gather per sub-block on Intel (here and in the widening kernel): T = 1 488 -> 226
// us and 661 -> 232 us on an Intel core; on other CPUs from scalar loads (kq_common.h g_gathers: the gathers were
// the slow part on AMD Zen 4). The arithmetic of matmul.h is unchanged:
// the 16 lane sums P[k] are exact integers, so any exact way of forming them gives the same bits:
//   per 32-value sub-block j: p_j = maddubs(|w|, x signed like w)   16 int16 lanes, lane k = values 2k, 2k+1
//     (|w x| pairs <= 2 * 127 * 127 < 2^15: never saturates);
//   per pair of sub-blocks (j, j+1): unpack p_j with p_(j+1) and vpmaddwd with their scales, so that each
//     int32 lane gets s_j p_j[k] + s_(j+1) p_(j+1)[k] (low 128-bit half: values 0-15 of each sub-block and
//     their 16-value scales, high half: values 16-31); the four pairs summed in int32;
//   per block: lanes back in canonical order (k 0-7 | 8-15) and L = fma(d dx, P, L) exactly as before.
// The prompt panels of the types whose weights stay within |w| <= 64 (kX128: Q6_K, IQ2_XXS, IQ3_XXS) give the
// activations the unsigned side instead: p_j = maddubs(x + 128, w) (|pair| <= 2 * 255 * 64 < 2^15) is the same
// exact sum plus 128 (w_2k + w_2k+1), whose scaled lane sums the panel subtracts once per block for all rows, so
// no vpsignb per row and sub-block (1.09-1.18x at 16 and 128 rows, docs/BENCHMARKS.md session 27).
// The mins (Q4_K, Q5_K) use the activation sub-block sums as the widening kernel does. Tested bit-identical
// with the scalar twin on fresh random blocks (tests/test_quant_kernels.py).
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/kq_common.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"

namespace strata {

namespace {

using namespace kq;

// A decoded block: w[j] the 32 int8 weights of sub-block j (unsigned codes when !kSigned), s16[g] the int16
// scale of values 16 g .. 16 g + 15; d, dmin and the 6-bit mins m[8] as in kquants_avx2.cpp. Decoders with
// kHead4 (Q4_K, Q5_K: one scale and one min per 32-value sub-block) fill sc16 / m16 instead of s16 / m: the eight
// scales and mins as int16 words (k4_head_simd), so that dword p is the pair (2p, 2p + 1) the products take.
struct Blk8 {
  __m256i w[8];
  alignas(32) int16_t s16[16];
  float d, dmin;
  alignas(16) uint8_t m[8];
  __m128i sc16, m16;
  __m256i scp;  // (kScp decoders, Q6_K, instead of s16) the scale pairs as dwords: 2p = (s16[4p], s16[4p + 2]),
                // 2p + 1 = (s16[4p + 1], s16[4p + 3]): the low and high halves' pair of sub-blocks (2p, 2p + 1)
};

// Float lane accumulators kept in the order of the products' int32 sums (a: lanes 0-3 | 8-11, b: 4-7 | 12-15) back in
// canonical order: lanes 0-7 and 8-15.
inline __m256 canonical_lo(__m256 a, __m256 b) { return _mm256_permute2f128_ps(a, b, 0x20); }
inline __m256 canonical_hi(__m256 a, __m256 b) { return _mm256_permute2f128_ps(a, b, 0x31); }

// Q4_K / Q5_K (kHead4): the block's scale and min pairs stored as dwords, so that the products broadcast them from
// memory (a load each: a lane permute, pair_dword, would take the shuffle port that the products' unpacks need;
// Q4_K 4096 x 4096 T = 1 674-684 -> 619-623 us on Zen 3), and the mins term of mins_words from them.
struct Head4Words {
  alignas(16) int32_t sc[4], m[4];
  explicit Head4Words(const Blk8& k) {
    _mm_store_si128(reinterpret_cast<__m128i*>(sc), k.sc16);
    _mm_store_si128(reinterpret_cast<__m128i*>(m), k.m16);
  }
  // mins_words(k.m16, bs, dmin, dx, Lm): the same sums and operations
  __m256 mins(const int16_t* bs, float dmin, const float* dx, __m256 Lm) const {
    __m256i M = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++)
      M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + 16 * p)),
                                                _mm256_set1_epi32(m[p])));
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(M), Lm);
  }
};
struct NoHead4Words {};

// Q4_K / Q5_K at T = 1: the block's M = sum_j m[j] bsum[j] of row 0 (the same integer as Head4Words::mins' lane 0),
// then Lm = fma(dmin dx, M, Lm) as one float: a quarter of the T = 1 kernel's time went to the 8-row form (Q4_K
// 2048 x 2048, one thread, --isa avx2: 153 -> 115 us without any mins). Row 0's pair p sits at words 16 p, 16 p + 1
// of bs and the words of rows 1..7 are 0 in a one-row QAct (QActBuf::view zeroes bsum), so the 128-bit loads at
// words 0, 14, 28 and 42 hold it at words 2 p, 2 p + 1 and zeros elsewhere: their OR is the eight sums in
// sub-block order, m16's order.
inline float mins_row0(__m128i m16, const int16_t* bs, float dmin, float dx, float Lm) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs));
  v = _mm_or_si128(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + 14)));
  v = _mm_or_si128(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + 28)));
  v = _mm_or_si128(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + 42)));
  __m128i s = _mm_madd_epi16(m16, v);
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  const __m128 f = _mm_mul_ss(_mm_set_ss(dmin), _mm_set_ss(dx));  // dmin dx rounded, as the 8-row form's multiply
  return _mm_cvtss_f32(_mm_fmadd_ss(f, _mm_cvtepi32_ps(s), _mm_set_ss(Lm)));
}
template <class Dec>
inline auto head4_words(const Blk8& k) {
  if constexpr (Dec::kHead4) return Head4Words(k);
  else return NoHead4Words{};
}

// The block's scale pairs as the products take them: lanes 0-3 the pair of values 0-15 of sub-blocks (2p, 2p + 1),
// lanes 4-7 of values 16-31 (for kHead4 decoders the same pair: one scale per sub-block).
template <class Dec>
inline __m256i scale_pairs(const Blk8& k, int p) {
  if constexpr (Dec::kHead4) return pair_dword(k.sc16, p);
  if constexpr (Dec::kScp)
    return _mm256_permutevar8x32_epi32(k.scp, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1,
                                                                 2 * p + 1, 2 * p + 1));
  const int j = 2 * p;
  const uint32_t lo = (uint16_t)k.s16[2 * j] | (uint32_t)(uint16_t)k.s16[2 * j + 2] << 16;
  const uint32_t hi = (uint16_t)k.s16[2 * j + 1] | (uint32_t)(uint16_t)k.s16[2 * j + 3] << 16;
  return _mm256_set_m128i(_mm_set1_epi32((int)hi), _mm_set1_epi32((int)lo));
}
// Q4_K / Q5_K header: d, dmin and the 6-bit scales and mins as words (k4_head_simd: the same values as k4_head).
inline void head4(const uint8_t* b, Blk8& o) {
  __m128 ddm;
  k4_head_simd(b, ddm, o.sc16, o.m16);
  o.d = _mm_cvtss_f32(ddm);
  o.dmin = _mm_cvtss_f32(_mm_movehdup_ps(ddm));
}

struct Dec8Q4K {
  static constexpr uint32_t kType = GGML_Q4_K;
  static constexpr int kBytes = 144;
  static constexpr int kMaxT = 8;
  static constexpr bool kHasMin = true, kSigned = false, kHead4 = true, kGrid = false, kScp = false, kOff32 = false;
  static inline void decode(const uint8_t* b, Blk8& o) {
    head4(b, o);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
      const __m256i by = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
      o.w[2 * c] = _mm256_and_si256(by, m4);
      o.w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(by, 4), m4);
    }
  }
};

struct Dec8Q5K {
  static constexpr uint32_t kType = GGML_Q5_K;
  static constexpr int kBytes = 176;
  static constexpr int kMaxT = 8;
  static constexpr bool kHasMin = true, kSigned = false, kHead4 = true, kGrid = false, kScp = false, kOff32 = false;
  static inline void decode(const uint8_t* b, Blk8& o) {
    head4(b, o);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    // bit j of qh byte l is the fifth bit of value l of sub-block j: moved to bit 4 by one 16-bit shift (the bits
    // that cross into the other byte of the word land outside bit 4) and the mask
    const auto fifth = [&](int j) {
      return _mm256_and_si256(j < 4 ? _mm256_slli_epi16(qh, 4 - j) : j > 4 ? _mm256_srli_epi16(qh, j - 4) : qh, m10);
    };
    for (int c = 0; c < 4; c++) {
      const __m256i by = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * c));
      const int j0 = 2 * c, j1 = 2 * c + 1;
      o.w[j0] = _mm256_or_si256(_mm256_and_si256(by, m4), fifth(j0));
      o.w[j1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(by, 4), m4), fifth(j1));
    }
  }
};

// Q6_K's unsigned 6-bit codes u = w + 32 (0..63) of a block, the high bits brought to bits 4-5 by one 16-bit shift
// and a mask each, and the 16 int8 scales (one per 16 values) in pair order (4p, 4p + 2, 4p + 1, 4p + 3) widened
// to int16 (Blk8::scp).
inline void q6k_codes(const uint8_t* b, Blk8& o) {
  o.d = h2f(b + 208);
  o.dmin = 0.f;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; h++) {  // k = 0..3: ql0 / ql1 low nibbles, then their high nibbles; qh bits 2k, 2k + 1
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
    o.w[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    o.w[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    o.w[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
    o.w[4 * h + 3] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
  }
  const __m128i order = _mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
  o.scp = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)), order));
}

// Q6_K signed (w = u - 32): the prompt panels' form, and the decode windows' for rows without the pair sums.
struct Dec8Q6K {
  static constexpr uint32_t kType = GGML_Q6_K;
  static constexpr int kBytes = 210;
  static constexpr int kMaxT = 8;
  static constexpr bool kHasMin = false, kSigned = true, kHead4 = false, kGrid = false, kScp = true, kOff32 = false;
  static constexpr bool kX128 = true;
  static inline void decode(const uint8_t* b, Blk8& o) {
    q6k_codes(b, o);
    for (int j = 0; j < 8; j++) o.w[j] = _mm256_sub_epi8(o.w[j], _mm256_set1_epi8(32));
  }
};

// Q6_K for the decode windows on the unsigned codes: per sub-block p = maddubs(u, x) - 32 * (x's pair sums,
// QAct::q8p, made once per activation row) is the same exact int16 lane sum as maddubs(|w|, x signed like w)
// (|p| <= 2 * 63 * 127 + 8128 < 2^15), without a vpabsb and a vpsignb per sub-block and a -32 per value.
struct Dec8Q6KU : Dec8Q6K {
  static constexpr bool kSigned = false, kOff32 = true;
  static inline void decode(const uint8_t* b, Blk8& o) { q6k_codes(b, o); }
};

struct Dec8IQ2XXS {
  static constexpr uint32_t kType = GGML_IQ2_XXS;
  static constexpr int kBytes = 66;
  static constexpr int kMaxT = 3;
  static constexpr bool kHasMin = false, kSigned = true, kHead4 = false, kGrid = true, kScp = false, kOff32 = false;
  static constexpr bool kX128 = true;
  // (kGrid) the block scale, sub-block ib's unsigned grid bytes, and its sign / scale word
  static inline float dscale(const uint8_t* b) { return h2f(b) * 0.125f; }
  static inline __m256i grid(const uint8_t* b, int ib) { return iq2xxs_grid4(b + 2 + 8 * ib); }
  static inline uint32_t aux(const uint8_t* b, int ib) { return u32_at(b + 2 + 8 * ib + 4); }
  static inline void decode(const uint8_t* b, Blk8& o) {
    o.d = h2f(b) * 0.125f;
    o.dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t* q = b + 2 + 8 * ib;
      const uint32_t aux1 = u32_at(q + 4);
      o.w[ib] = iq_signed(iq2xxs_grid4(q), aux1);
      o.s16[2 * ib] = o.s16[2 * ib + 1] = (int16_t)(2 * (aux1 >> 28) + 1);
    }
  }
};

struct Dec8IQ3XXS {
  static constexpr uint32_t kType = GGML_IQ3_XXS;
  static constexpr int kBytes = 98;
  static constexpr int kMaxT = 3;
  static constexpr bool kHasMin = false, kSigned = true, kHead4 = false, kGrid = true, kScp = false, kOff32 = false;
  static constexpr bool kX128 = true;
  static inline float dscale(const uint8_t* b) { return h2f(b) * 0.25f; }
  static inline __m256i grid(const uint8_t* b, int ib) { return iq3xxs_grid8(b + 2 + 8 * ib); }
  static inline uint32_t aux(const uint8_t* b, int ib) { return u32_at(b + 66 + 4 * ib); }
  static inline void decode(const uint8_t* b, Blk8& o) {
    o.d = h2f(b) * 0.25f;
    o.dmin = 0.f;
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t* q = b + 2 + 8 * ib;
      const uint32_t aux = u32_at(b + 66 + 4 * ib);
      o.w[ib] = iq_signed(iq3xxs_grid8(q), aux);
      o.s16[2 * ib] = o.s16[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
    }
  }
};

struct Dec8IQ4XS {
  static constexpr uint32_t kType = GGML_IQ4_XS;
  static constexpr int kBytes = 136;
  static constexpr int kMaxT = 3;
  static constexpr bool kHasMin = false, kSigned = true, kHead4 = false, kGrid = false, kScp = false, kOff32 = false;
  static constexpr bool kX128 = false;
  static inline void decode(const uint8_t* b, Blk8& o) {
    o.d = h2f(b);
    o.dmin = 0.f;
    const __m256i values = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int ib = 0; ib < 8; ib++) {  // bytes 16 ib .. 16 ib + 15: low nibbles values 0-15, high nibbles 16-31
      const __m128i by = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 + 16 * ib));
      const __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(by, 4), by), m4);
      o.w[ib] = _mm256_shuffle_epi8(values, codes);
      o.s16[2 * ib] = o.s16[2 * ib + 1] = (int16_t)(iq4xs_scale(b, ib) - 32);
    }
  }
};

// Rows [0, T) of the int8 activations (QAct::q8) interleaved per 64 values into out [T][cols]: dword k (k = 0..15)
// of group c = values 2k, 2k+1 of sub-block 2c, then the same of 2c + 1 (act8_avx512.h's order). kPlus128: the
// values as x + 128 (x ^ 0x80, unsigned: the kX128 panels' side of vpmaddubsw).
template <bool kPlus128 = false>
inline void interleave_q8(const QAct& q, int T, int8_t* out) {
  const __m256i flip = _mm256_set1_epi8(kPlus128 ? (char)0x80 : 0);
  for (int t = 0; t < T; t++) {
    const int8_t* src = q.q8 + (int64_t)t * q.ldq;
    int8_t* dst = out + (int64_t)t * q.cols;
    for (int64_t c = 0; c < q.cols; c += 64) {
      __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c));
      __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c + 32));
      if constexpr (kPlus128) {
        A = _mm256_xor_si256(A, flip);
        B = _mm256_xor_si256(B, flip);
      }
      const __m256i lo = _mm256_unpacklo_epi16(A, B), hi = _mm256_unpackhi_epi16(A, B);  // k 0-3 | 8-11, 4-7 | 12-15
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + c), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + c + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
  }
}

// Windows of T >= 2 rows: the pair of sub-blocks' weights interleaved once per block in interleave_q8's order, so
// that vpmaddubsw + vpmaddwd land each row's products in canonical lanes directly (register 0: lanes 0-7 = values
// 0-15 of both sub-blocks, register 1: lanes 8-15), with no unpacks or lane permutes per row: per 64 values and
// row 6 operations (8 for signed weights) against 8 (10), for 16 per block shared by the rows. The same exact lane
// sums, so the same bits.
template <class Dec, int T>
void rows_kq8_il_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  static_assert(!Dec::kScp && !Dec::kOff32, "the interleaved kernel is for Q4_K / Q5_K (rows_kq8's dispatch)");
  const int64_t nb = W.cols / QK_K, cols = a.q.cols;
  thread_local std::vector<int8_t, Align64<int8_t>> xi;  // per calling thread, from the shared read-only rows
  xi.resize((size_t)T * cols);
  interleave_q8(a.q, T, xi.data());
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m256 Llo[T], Lhi[T];
    for (int t = 0; t < T; t++) Llo[t] = Lhi[t] = _mm256_setzero_ps();
    __m256 Lm = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      Blk8 k;
      prefetch_ahead<Dec::kBytes>(row + b * Dec::kBytes);
      Dec::decode(row + b * Dec::kBytes, k);
      [[maybe_unused]] const auto hw = head4_words<Dec>(k);
      __m256i wi[8], aw[8], sc[8];
      for (int p = 0; p < 4; p++) {
        const int j = 2 * p;
        const __m256i lo = _mm256_unpacklo_epi16(k.w[j], k.w[j + 1]), hi = _mm256_unpackhi_epi16(k.w[j], k.w[j + 1]);
        wi[j] = _mm256_permute2x128_si256(lo, hi, 0x20);      // lanes 0-7: values 0-15 of j and j + 1
        wi[j + 1] = _mm256_permute2x128_si256(lo, hi, 0x31);  // lanes 8-15: values 16-31
        aw[j] = Dec::kSigned ? _mm256_abs_epi8(wi[j]) : wi[j];
        aw[j + 1] = Dec::kSigned ? _mm256_abs_epi8(wi[j + 1]) : wi[j + 1];
        if constexpr (Dec::kHead4) {
          sc[j] = sc[j + 1] = _mm256_set1_epi32(hw.sc[p]);
        } else {
          sc[j] = _mm256_set1_epi32((int)((uint16_t)k.s16[2 * j] | (uint32_t)(uint16_t)k.s16[2 * j + 2] << 16));
          sc[j + 1] = _mm256_set1_epi32((int)((uint16_t)k.s16[2 * j + 1] | (uint32_t)(uint16_t)k.s16[2 * j + 3] << 16));
        }
      }
      const float* dx = a.q.d + b * 8;
      for (int t = 0; t < T; t++) {
        const int8_t* x = xi.data() + t * cols + b * QK_K;
        __m256i A = _mm256_setzero_si256(), B = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
          const int j = 2 * p;
          __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 64 * p));
          __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 64 * p + 32));
          if (Dec::kSigned) {
            x0 = _mm256_sign_epi8(x0, wi[j]);
            x1 = _mm256_sign_epi8(x1, wi[j + 1]);
          }
          A = _mm256_add_epi32(A, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], x0), sc[j]));
          B = _mm256_add_epi32(B, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j + 1], x1), sc[j + 1]));
        }
        const __m256 dd = _mm256_set1_ps(k.d * dx[t]);
        Llo[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(A), Llo[t]);
        Lhi[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(B), Lhi[t]);
      }
      if constexpr (Dec::kHasMin) Lm = hw.mins(a.q.bsum + b * 64, k.dmin, dx, Lm);  // (kHasMin: kHead4)
    }
    alignas(32) float lm[8];
    _mm256_store_ps(lm, Lm);
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(Llo[t], Lhi[t]) - lm[t];
  }
}

template <class Dec, int T>
void rows_kq8_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t nb = W.cols / QK_K;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m256 La[T], Lb[T];  // lanes 0-3 | 8-11 and 4-7 | 12-15 (A / B's order)
    for (int t = 0; t < T; t++) La[t] = Lb[t] = _mm256_setzero_ps();
    __m256 Lm = _mm256_setzero_ps();
    float lm1 = 0.f;  // T = 1: the mins' sum (mins_row0)
    for (int64_t b = 0; b < nb; b++) {
      Blk8 k;
      prefetch_ahead<Dec::kBytes>(row + b * Dec::kBytes);
      Dec::decode(row + b * Dec::kBytes, k);
      __m256i aw[8], sc[4];
      for (int j = 0; j < 8; j++) aw[j] = Dec::kSigned ? _mm256_abs_epi8(k.w[j]) : k.w[j];
      [[maybe_unused]] const auto hw = head4_words<Dec>(k);
      for (int p = 0; p < 4; p++) {  // int16 pairs (s_j, s_j+1)
        if constexpr (Dec::kHead4) sc[p] = _mm256_set1_epi32(hw.sc[p]);
        else sc[p] = scale_pairs<Dec>(k, p);
      }
      const float* dx = a.q.d + b * 8;
      for (int t = 0; t < T; t++) {
        const int8_t* x = a.q.q8 + t * a.q.ldq + b * QK_K;
        __m256i A = _mm256_setzero_si256(), B = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
          const int j = 2 * p;
          __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * j));
          __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * j + 32));
          if (Dec::kSigned) {
            x0 = _mm256_sign_epi8(x0, k.w[j]);
            x1 = _mm256_sign_epi8(x1, k.w[j + 1]);
          }
          __m256i p0 = _mm256_maddubs_epi16(aw[j], x0), p1 = _mm256_maddubs_epi16(aw[j + 1], x1);
          if constexpr (Dec::kOff32) {
            const int16_t* c = a.q.q8p + t * (a.q.ldq / 2) + b * (QK_K / 2) + 16 * j;
            p0 = _mm256_sub_epi16(p0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
            p1 = _mm256_sub_epi16(p1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 16)));
          }
          A = _mm256_add_epi32(A, _mm256_madd_epi16(_mm256_unpacklo_epi16(p0, p1), sc[p]));  // lanes 0-3 | 8-11
          B = _mm256_add_epi32(B, _mm256_madd_epi16(_mm256_unpackhi_epi16(p0, p1), sc[p]));  // lanes 4-7 | 12-15
        }
        // (in A / B's lane order: the fma is lane by lane with one broadcast factor, so the canonical order can wait
        // for the row's end, one lane permute a row instead of two a block)
        const __m256 dd = _mm256_set1_ps(k.d * dx[t]);
        La[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(A), La[t]);
        Lb[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(B), Lb[t]);
      }
      if constexpr (Dec::kHasMin && T == 1) lm1 = mins_row0(k.m16, a.q.bsum + b * 64, k.dmin, dx[0], lm1);
      else if constexpr (Dec::kHasMin) Lm = hw.mins(a.q.bsum + b * 64, k.dmin, dx, Lm);  // (kHasMin: kHead4)
    }
    alignas(32) float lm[8];
    _mm256_store_ps(lm, Lm);
    if constexpr (T == 1) lm[0] = lm1;
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(canonical_lo(La[t], Lb[t]), canonical_hi(La[t], Lb[t])) - lm[t];
  }
}

// Decode windows (T <= kMaxT) of the grid types (IQ2_XXS, IQ3_XXS), fused per pair of sub-blocks: the grid bytes
// are positive, so |w| is the grid row itself and the signs go onto the activations (vpsignb by +-1 bytes,
// kSignPm), and each sub-block's scale comes from its sign word in registers; no decoded block is stored
// (rows_kq8_t's Blk8: 8 registers and their absolute values, spilled). Per sub-block: the grid and sign lookups,
// then per row one vpsignb and one vpmaddubsw; the same lane sums P (exact integers) and float operations as
// rows_kq8_t, so the same bits (tests/test_quant_kernels.py, both ways of looking up the grid).
// (BMI1's bextr for these indices measured 1.11-1.15x on IQ2_XXS T = 1 with the pair loop below rolled, and no
// different, 1.00-1.04x, once it is unrolled; slower on IQ3_XXS: not used. docs/BENCHMARKS.md session 25)
inline __m256i sign_pm(uint32_t signs) {
  return _mm256_set_epi64x((long long)kSignPm[(signs >> 21) & 127], (long long)kSignPm[(signs >> 14) & 127],
                           (long long)kSignPm[(signs >> 7) & 127], (long long)kSignPm[signs & 127]);
}
template <class Dec, int T>
void rows_grid_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  static_assert(Dec::kGrid && T >= 1 && T <= Dec::kMaxT, "the fused grid kernel is for decode windows of IQ2/IQ3_XXS");
  const int64_t nb = W.cols / QK_K;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m256 La[T], Lb[T];  // lanes 0-3 | 8-11 and 4-7 | 12-15 (A / B's order)
    for (int t = 0; t < T; t++) La[t] = Lb[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* blk = row + b * Dec::kBytes;
      prefetch_ahead<Dec::kBytes>(blk);
      __m256i A[T], B[T];
      for (int t = 0; t < T; t++) A[t] = B[t] = _mm256_setzero_si256();
      // the four pairs unrolled (the compiler kept the loop): 1.03-1.17x for IQ2_XXS and IQ3_XXS at T = 1..3 in
      // one process, alternated against the loop (AMD Zen 3, docs/BENCHMARKS.md session 25)
#pragma GCC unroll 4
      for (int p = 0; p < 4; p++) {
        const int j = 2 * p;
        const uint32_t u0 = Dec::aux(blk, j), u1 = Dec::aux(blk, j + 1);
        const __m256i g0 = Dec::grid(blk, j), g1 = Dec::grid(blk, j + 1);
        const __m256i s0 = sign_pm(u0), s1 = sign_pm(u1);
        // the scale pair (s_j, s_j+1): one scale per sub-block, so the same for values 0-15 and 16-31
        const __m256i sc = _mm256_set1_epi32((int)((2 * (u0 >> 28) + 1) | (2 * (u1 >> 28) + 1) << 16));
        for (int t = 0; t < T; t++) {
          const int8_t* x = a.q.q8 + t * a.q.ldq + b * QK_K + 32 * j;
          const __m256i x0 = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), s0);
          const __m256i x1 = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)), s1);
          const __m256i p0 = _mm256_maddubs_epi16(g0, x0), p1 = _mm256_maddubs_epi16(g1, x1);
          A[t] = _mm256_add_epi32(A[t], _mm256_madd_epi16(_mm256_unpacklo_epi16(p0, p1), sc));  // lanes 0-3 | 8-11
          B[t] = _mm256_add_epi32(B[t], _mm256_madd_epi16(_mm256_unpackhi_epi16(p0, p1), sc));  // lanes 4-7 | 12-15
        }
      }
      const float d = Dec::dscale(blk);
      const float* dx = a.q.d + b * 8;
      for (int t = 0; t < T; t++) {  // (A / B's lane order, as rows_kq8_t)
        const __m256 dd = _mm256_set1_ps(d * dx[t]);
        La[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(A[t]), La[t]);
        Lb[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(B[t]), Lb[t]);
      }
    }
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(canonical_lo(La[t], Lb[t]), canonical_hi(La[t], Lb[t]));
  }
}

template <class Dec>
RowsFn wide_fn(uint32_t type) {
  static const RowsFn f = rows_fn_kq_avx2(type);
  return f;
}

// Prompt windows (several passes): each weight row's blocks decoded and interleaved once into a panel (the
// weights as rows_kq8_il_t holds them in registers: interleaved bytes, the scale pairs as dwords), then multiplied
// into every activation row of every pass, 4 rows at a time (a register tile: 4 rows x 2 int32 lane sums per
// block, the weights of a pair of sub-blocks loaded once for the 4 rows). kPanel8Rows weight rows share one
// panel, so that a group of activation rows stays in L1 across them. Each output element gets rows_kq8_il_t's
// exact lane sums and then the same float operations in the same order (fma(d * dx, P, L) per block, reduce16):
// bit-identical to the per-pass kernels and the scalar twin (tested). Only for the signed types, which have no
// mins term (the per-pass kernel's y = reduce16 - 0 is reduce16's value exactly).
// kX128's bound: the largest weight byte of a grid table (the IQ grids are unsigned; the signs come apart)
template <class T, size_t N>
constexpr int max_grid_byte(const T (&t)[N]) {
  int m = 0;
  for (size_t i = 0; i < N; i++)
    for (size_t k = 0; k < sizeof(T); k++) m = std::max(m, (int)((t[i] >> (8 * k)) & 0xFF));
  return m;
}
static_assert(max_grid_byte(kIq2xxsGrid) <= 64 && max_grid_byte(kIq3xxsGrid) <= 64, "kX128 needs |w| <= 64");

struct alignas(32) Pan8 {
  __m256i wi[8];     // interleaved weights (wi[2p]: lanes 0-7 of the pair p of sub-blocks, wi[2p + 1]: lanes 8-15)
  __m256i start[2];  // (kX128) the lane sums' starting values, lanes 0-7 and 8-15
  int32_t sc[8];     // the scale pairs of wi[j] (as rows_kq8_il_t's sc[j])
  float d;
};
constexpr int64_t kPanel8Rows = 8;

template <class Dec>
inline void pack8(const uint8_t* blk, Pan8& o) {
  static_assert(Dec::kSigned && !Dec::kHasMin, "the panels are for the signed types (s16, no mins)");
  Blk8 k;
  Dec::decode(blk, k);
  for (int p = 0; p < 4; p++) {
    const int j = 2 * p;
    const __m256i lo = _mm256_unpacklo_epi16(k.w[j], k.w[j + 1]), hi = _mm256_unpackhi_epi16(k.w[j], k.w[j + 1]);
    _mm256_store_si256(&o.wi[j], _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_store_si256(&o.wi[j + 1], _mm256_permute2x128_si256(lo, hi, 0x31));
    if constexpr (!Dec::kScp) {
      o.sc[j] = (int)((uint16_t)k.s16[2 * j] | (uint32_t)(uint16_t)k.s16[2 * j + 2] << 16);
      o.sc[j + 1] = (int)((uint16_t)k.s16[2 * j + 1] | (uint32_t)(uint16_t)k.s16[2 * j + 3] << 16);
    }
  }
  if constexpr (Dec::kScp) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.sc), k.scp);  // (the same dwords)
  o.d = k.d;
  if constexpr (Dec::kX128) {  // -(the lane sums of 128 w)
    const __m256i h = _mm256_set1_epi8((char)0x80);
    __m256i n0 = _mm256_setzero_si256(), n1 = _mm256_setzero_si256();
    for (int j = 0; j < 8; j += 2) {
      n0 = _mm256_sub_epi32(n0, _mm256_madd_epi16(_mm256_maddubs_epi16(h, o.wi[j]), _mm256_set1_epi32(o.sc[j])));
      n1 = _mm256_sub_epi32(n1, _mm256_madd_epi16(_mm256_maddubs_epi16(h, o.wi[j + 1]), _mm256_set1_epi32(o.sc[j + 1])));
    }
    o.start[0] = n0;
    o.start[1] = n1;
  }
}

// nt (1..4) activation rows x (interleaved, cols apart) against one panel row: the float lane accumulators of
// each row over all blocks, then y[t] = reduce16.
template <class Dec, int NT>
inline void tile8(const Pan8* pb, int64_t nb, const int8_t* x, int64_t cols, const float* dx, float* y, int64_t ldy) {
  __m256 Llo[NT], Lhi[NT];
  for (int t = 0; t < NT; t++) Llo[t] = Lhi[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const Pan8& B = pb[b];
    __m256i A[NT], C[NT];
    for (int t = 0; t < NT; t++) {
      A[t] = Dec::kX128 ? B.start[0] : _mm256_setzero_si256();
      C[t] = Dec::kX128 ? B.start[1] : _mm256_setzero_si256();
    }
    for (int p = 0; p < 4; p++) {
      const int j = 2 * p;
      const __m256i w0 = _mm256_load_si256(&B.wi[j]), w1 = _mm256_load_si256(&B.wi[j + 1]);
      const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);  // (unused where kX128)
      const __m256i s0 = _mm256_set1_epi32(B.sc[j]), s1 = _mm256_set1_epi32(B.sc[j + 1]);
      for (int t = 0; t < NT; t++) {
        const int8_t* xt = x + t * cols + b * QK_K + 64 * p;
        const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt));
        const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 32));
        // kX128: x + 128 against the signed weights; else |w| against x signed like w
        const __m256i p0 = Dec::kX128 ? _mm256_maddubs_epi16(x0, w0) : _mm256_maddubs_epi16(a0, _mm256_sign_epi8(x0, w0));
        const __m256i p1 = Dec::kX128 ? _mm256_maddubs_epi16(x1, w1) : _mm256_maddubs_epi16(a1, _mm256_sign_epi8(x1, w1));
        A[t] = _mm256_add_epi32(A[t], _mm256_madd_epi16(p0, s0));
        C[t] = _mm256_add_epi32(C[t], _mm256_madd_epi16(p1, s1));
      }
    }
    for (int t = 0; t < NT; t++) {
      const __m256 dd = _mm256_set1_ps(B.d * dx[b * 8 + t]);
      Llo[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(A[t]), Llo[t]);
      Lhi[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(C[t]), Lhi[t]);
    }
  }
  for (int t = 0; t < NT; t++) y[t * ldy] = reduce16(Llo[t], Lhi[t]);
}

template <class Dec>
void rows_kq8_many(const MatView& W, const Act* pass, int np, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (!pass[0].q.q8) {  // rows prepared without their int8 copy: the widening kernel, pass after pass
    for (int p = 0; p < np; p++) wide_fn<Dec>(Dec::kType)(W, pass[p], y + (int64_t)p * kMaxRowsPerPass * ldy, ldy, r0, r1);
    return;
  }
  const int64_t nb = W.cols / QK_K, cols = W.cols;
  thread_local std::vector<int8_t, Align64<int8_t>> xi;  // every pass's rows interleaved, [pass][8][cols]
  thread_local std::vector<Pan8, Align64<Pan8>> panel;   // [kPanel8Rows][nb]
  xi.resize((size_t)np * kMaxRowsPerPass * cols);
  for (int p = 0; p < np; p++)
    interleave_q8<Dec::kX128>(pass[p].q, pass[p].T, xi.data() + (size_t)p * kMaxRowsPerPass * cols);
  if ((int64_t)panel.size() < kPanel8Rows * nb) panel.resize(kPanel8Rows * nb);
  for (int64_t rb = r0; rb < r1; rb += kPanel8Rows) {
    const int64_t re = rb + kPanel8Rows < r1 ? rb + kPanel8Rows : r1;
    for (int64_t r = rb; r < re; r++) {
      const uint8_t* row = W.data + r * W.row_bytes;
      Pan8* pb = panel.data() + (r - rb) * nb;
      for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead<Dec::kBytes>(row + b * Dec::kBytes);
        pack8<Dec>(row + b * Dec::kBytes, pb[b]);
      }
    }
    for (int p = 0; p < np; p++) {
      const int T = pass[p].T;
      const int8_t* xp = xi.data() + (size_t)p * kMaxRowsPerPass * cols;
      float* yp = y + (int64_t)p * kMaxRowsPerPass * ldy;
      for (int t0 = 0; t0 < T; t0 += 2) {
        const int nt = T - t0 < 2 ? T - t0 : 2;
        for (int64_t r = rb; r < re; r++) {
          const Pan8* pb = panel.data() + (r - rb) * nb;
          const int8_t* xt = xp + t0 * cols;
          const float* dx = pass[p].q.d + t0;
          float* yt = yp + t0 * ldy + r;
          if (nt == 2) tile8<Dec, 2>(pb, nb, xt, cols, dx, yt, ldy);
          else tile8<Dec, 1>(pb, nb, xt, cols, dx, yt, ldy);
        }
      }
    }
  }
}


template <class Dec, uint32_t kType>
void rows_kq8(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  // (rows prepared without their int8 copy, QAct::q8, also take the widening kernel)
  if (a.T > Dec::kMaxT || !a.q.q8) return wide_fn<Dec>(kType)(W, a, y, ldy, r0, r1);
  // rows prepared for another type of the same kind (moe.cpp shares them) may lack the pair sums: the signed form
  if constexpr (Dec::kOff32)
    if (!a.q.q8p) return rows_kq8<Dec8Q6K, kType>(W, a, y, ldy, r0, r1);
  with_rows(a.T, [&](auto t) {
    constexpr int kT = decltype(t)::value;
    if constexpr (kT <= Dec::kMaxT) {
      // (signed weights keep the unpacking form: the interleaved one measured 7-9 % slower for Q6_K at T = 2-4)
      if constexpr (Dec::kGrid) rows_grid_t<Dec, kT>(W, a, y, ldy, r0, r1);
      else if constexpr (kT == 1 || Dec::kSigned || Dec::kOff32) rows_kq8_t<Dec, kT>(W, a, y, ldy, r0, r1);
      else rows_kq8_il_t<Dec, kT>(W, a, y, ldy, r0, r1);
    }
  });
}

}  // namespace

// Measured (1024 x 2048, 128 rows, one thread, CPU time, main's build alternated): Q6_K 36-38 -> 44-46 GMAC/s,
// IQ3_XXS 33 -> 42-44, IQ4_XS 29-33 -> 45-47, IQ2_XXS (1024 x 1024) 30-31 -> 38-41. Q4_K and Q5_K (unsigned codes)
// stay on the per-pass interleaved kernel: the panel measured the same there (52-56 GMAC/s both ways), and no better
// in a 128-token prefill.
RowsManyFn rows_many_fn_kq8_avx2(uint32_t type) {
  switch (type) {
    case GGML_Q6_K: return rows_kq8_many<Dec8Q6K>;
    case GGML_IQ2_XXS: return rows_kq8_many<Dec8IQ2XXS>;
    case GGML_IQ3_XXS: return rows_kq8_many<Dec8IQ3XXS>;
    case GGML_IQ4_XS: return rows_kq8_many<Dec8IQ4XS>;
    default: return nullptr;
  }
}

RowsFn rows_fn_kq8_avx2(uint32_t type) {
  switch (type) {
    case GGML_Q4_K: return rows_kq8<Dec8Q4K, GGML_Q4_K>;
    case GGML_Q5_K: return rows_kq8<Dec8Q5K, GGML_Q5_K>;
    case GGML_Q6_K: return rows_kq8<Dec8Q6KU, GGML_Q6_K>;
    case GGML_IQ2_XXS: return rows_kq8<Dec8IQ2XXS, GGML_IQ2_XXS>;
    case GGML_IQ3_XXS: return rows_kq8<Dec8IQ3XXS, GGML_IQ3_XXS>;
    case GGML_IQ4_XS: return rows_kq8<Dec8IQ4XS, GGML_IQ4_XS>;
    default: return nullptr;
  }
}

}  // namespace strata
