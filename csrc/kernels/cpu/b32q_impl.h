// The 32-value block types with int8 activations (matmul.h: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) on 256-bit registers, in
// matmul.h's lane order: included by matmul_avx2.cpp and matmul_avx512.cpp (internal linkage: each file's copy is
// built with its own flags). Blocks go in pairs (2m, 2m+1), one 8-lane register a pair: lanes 0-3 the first block's
// 4 lane sums, 4-7 the second's, i.e. canonical lanes 8*(m % 2) + 0..7 (= 4*(b % 4) + i): pairs m even into `lo`,
// odd into `hi`, reduce16(lo, hi).
//
// Per pair and row: A = [2m: u0..15 | 2m+1: u0..15], B = [u16..31 | u16..31] (the low and high nibbles of the two
// blocks' qs bytes) with u unsigned, the activations q in QAct32::qp's matching layout. vpmaddubsw(A, q) and (B, q)
// give pair sums |.| <= 2*31*127, added as int16 (<= 15748: no overflow), vpmaddwd with ones the lane sums of u*q:
//   Offset16 (Q4_0, Q5_0, MXFP4: |v| <= 16): u = v + 16, P = that minus QAct32::cq (16 * the lane sums of q);
//   Unsigned (Q4_1, Q5_1: v = the code, 0..31): u = v, P = that; the min term m*dx times QAct32::sq after;
//   Sign (IQ4_NL, |v| <= 127): |v| times q with v's sign, the two halves widened apart.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/blocks32.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"

namespace strata {
namespace {

// The f16 values at p and (two: at q; else 0) as [x x x x y y y y] by one conversion (exact: every f16 is a float)
inline __m256 b32q_f16_pair(const uint8_t* p, const uint8_t* q, bool two) {
  uint16_t a, b = 0;
  std::memcpy(&a, p, 2);
  if (two) std::memcpy(&b, q, 2);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(a | (uint32_t)b << 16)));
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

enum class B32Mode { Offset16, Unsigned, Sign };

// pair(b, two, A, B): the u (Sign: v) of blocks b and (two ? b + 1 : none, zeros) as above; scales(b, two) / mins(b,
// two): the two blocks' s / m in their 4 lanes each (0 for a missing second block).
// The pshufb table of code -> u (Offset16: v + 16) or v.
template <const int8_t* kValues, int kAdd>
struct B32Table {
  alignas(16) static constexpr int8_t t[16] = {
      (int8_t)(kValues[0] + kAdd),  (int8_t)(kValues[1] + kAdd),  (int8_t)(kValues[2] + kAdd),  (int8_t)(kValues[3] + kAdd),
      (int8_t)(kValues[4] + kAdd),  (int8_t)(kValues[5] + kAdd),  (int8_t)(kValues[6] + kAdd),  (int8_t)(kValues[7] + kAdd),
      (int8_t)(kValues[8] + kAdd),  (int8_t)(kValues[9] + kAdd),  (int8_t)(kValues[10] + kAdd), (int8_t)(kValues[11] + kAdd),
      (int8_t)(kValues[12] + kAdd), (int8_t)(kValues[13] + kAdd), (int8_t)(kValues[14] + kAdd), (int8_t)(kValues[15] + kAdd)};
};
// kScaleAt < 0: MXFP4's e8m0 byte 0; kMinAt < 0: no min
template <const int8_t* kValues, int kScaleAt, int kMinAt, int kQsAt, int kSize, B32Mode kModeV>
struct B32Int4 {
  static constexpr int kBytes = kSize;
  static constexpr B32Mode kMode = kModeV;
  static void pair(const uint8_t* b, bool two, __m256i& A, __m256i& B) {
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQsAt));
    const __m128i x1 = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kSize + kQsAt)) : _mm_setzero_si128();
    const __m256i x = _mm256_set_m128i(x1, x0), k15 = _mm256_set1_epi8(15);
    constexpr int kAdd = kModeV == B32Mode::Offset16 ? 16 : 0;
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(B32Table<kValues, kAdd>::t)));
    A = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, k15));  // pshufb: code -> value in each 16-byte half
    B = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), k15));
    if (!two) {
      A = _mm256_inserti128_si256(A, _mm_setzero_si128(), 1);
      B = _mm256_inserti128_si256(B, _mm_setzero_si128(), 1);
    }
  }
  // the pair's s (m) in the first block's 4 lanes and the second's (0 without it); MXFP4's e8m0 scale by scalar code
  // (its vector form measured 0.86-0.94x on Zen 3)
  static __m256 scales(const uint8_t* b, bool two) {
    if constexpr (kScaleAt >= 0) return b32q_f16_pair(b + kScaleAt, b + kSize + kScaleAt, two);
    else return _mm256_set_m128(_mm_set1_ps(two ? e8m0_half(b[kSize]) : 0.f), _mm_set1_ps(e8m0_half(b[0])));
  }
  static __m256 mins(const uint8_t* b, bool two) {
    if constexpr (kMinAt >= 0) return b32q_f16_pair(b + kMinAt, b + kSize + kMinAt, two);
    else return _mm256_setzero_ps();
  }
};
using B32Q4_0 = B32Int4<kQ4_0Values, 0, -1, 2, 18, B32Mode::Offset16>;
using B32Q4_1 = B32Int4<kQ4_1Values, 0, 2, 4, 20, B32Mode::Unsigned>;
using B32Iq4Nl = B32Int4<kIq4Values, 0, -1, 2, 18, B32Mode::Sign>;
using B32Mxfp4 = B32Int4<kMxfp4Values, -1, -1, 1, 17, B32Mode::Offset16>;
// Q5_0 (code5 - 16, u = code5) and Q5_1 (code5, + m): bit 4 of value i from bit i of qh
template <bool kMin>
struct B32Q5 {
  static constexpr int kBytes = kMin ? 24 : 22;
  static constexpr B32Mode kMode = kMin ? B32Mode::Unsigned : B32Mode::Offset16;
  static constexpr int kQhAt = kMin ? 4 : 2;
  // 0x10 in byte i of each 16-byte half where bit i (kHalf 0) or 16 + i (kHalf 1) of that half's qh is set
  template <int kHalf>
  static __m256i high(__m256i qh) {
    const __m256i sel = _mm256_setr_epi8(2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf,
                                         2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1,
                                         2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf,
                                         2 * kHalf, 2 * kHalf, 2 * kHalf, 2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1,
                                         2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1, 2 * kHalf + 1);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i bytes = _mm256_and_si256(_mm256_shuffle_epi8(qh, sel), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, bit), _mm256_set1_epi8(0x10));
  }
  static void pair(const uint8_t* b, bool two, __m256i& A, __m256i& B) {
    uint32_t qh0, qh1 = 0;
    std::memcpy(&qh0, b + kQhAt, 4);
    if (two) std::memcpy(&qh1, b + kBytes + kQhAt, 4);
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQhAt + 4));
    const __m128i x1 = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kBytes + kQhAt + 4)) : _mm_setzero_si128();
    const __m256i x = _mm256_set_m128i(x1, x0), k15 = _mm256_set1_epi8(15);
    const __m256i qh = _mm256_set_m128i(_mm_cvtsi32_si128((int)qh1), _mm_cvtsi32_si128((int)qh0));
    A = _mm256_or_si256(_mm256_and_si256(x, k15), high<0>(qh));  // u = code5 (Q5_0: = v + 16)
    B = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), k15), high<1>(qh));
    if (!two) {
      A = _mm256_inserti128_si256(A, _mm_setzero_si128(), 1);
      B = _mm256_inserti128_si256(B, _mm_setzero_si128(), 1);
    }
  }
  static __m256 scales(const uint8_t* b, bool two) { return b32q_f16_pair(b, b + kBytes, two); }
  static __m256 mins(const uint8_t* b, bool two) {
    if constexpr (kMin) return b32q_f16_pair(b + 2, b + kBytes + 2, two);
    else return _mm256_setzero_ps();
  }
};
using B32Q5_0 = B32Q5<false>;
using B32Q5_1 = B32Q5<true>;

// Pair m (blocks b = 2m and b + 1 when `two`) of a row into the T rows' accumulators (acc: lo or hi).
template <class Blk, int T>
inline void b32q_pair(const uint8_t* blk, const QAct32& A, int64_t m, bool two, __m256* acc) {
  __m256i va, vb;
  Blk::pair(blk, two, va, vb);
  const __m256i ones = _mm256_set1_epi16(1);
  // the blocks' s in their 4 lanes each; times QAct32::dp: s*dx, one product per lane
  const __m256 s = Blk::scales(blk, two);
  const int64_t at = m;  // (t*np + m): row t's pairs np apart
  if constexpr (Blk::kMode != B32Mode::Sign) {
    __m256 mn = _mm256_setzero_ps();
    if constexpr (Blk::kMode == B32Mode::Unsigned)
      mn = Blk::mins(blk, two);
    for (int t = 0; t < T; t++) {
      const int64_t k = at + t * A.np;
      const int8_t* q = A.qp + k * 64;
      const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(va, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
                                           _mm256_maddubs_epi16(vb, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32))));
      __m256i P = _mm256_madd_epi16(s16, ones);
      if constexpr (Blk::kMode == B32Mode::Offset16)
        P = _mm256_sub_epi32(P, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A.cq + k * 8)));
      const __m256 dx = _mm256_loadu_ps(A.dp + k * 8);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(s, dx), _mm256_cvtepi32_ps(P), acc[t]);
      if constexpr (Blk::kMode == B32Mode::Unsigned)
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(mn, dx), _mm256_loadu_ps(A.sq + k * 8), acc[t]);
    }
  } else {
    const __m256i aa = _mm256_sign_epi8(va, va), ab = _mm256_sign_epi8(vb, vb);
    for (int t = 0; t < T; t++) {
      const int64_t k = at + t * A.np;
      const int8_t* q = A.qp + k * 64;
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
      const __m256i pa = _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(qa, va)), ones);
      const __m256i pb = _mm256_madd_epi16(_mm256_maddubs_epi16(ab, _mm256_sign_epi8(qb, vb)), ones);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(s, _mm256_loadu_ps(A.dp + k * 8)), _mm256_cvtepi32_ps(_mm256_add_epi32(pa, pb)), acc[t]);
    }
  }
}

// Up to 4 rows: the even and odd pairs' accumulators side by side (two independent chains at T = 1). From 5 rows
// (2T registers would spill): the row's even pairs, then its odd ones, T accumulators live at a time; each lane still
// gets its blocks in increasing order.
template <class Blk, int T>
void rows_b32q_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const QAct32& A = a.q32;
  const int64_t nb = W.cols / 32, np = (nb + 1) / 2;
  constexpr int64_t kAhead = 2048;  // prefetch distance in bytes (as kq_common.h's)
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m256 lo[T], hi[T];
    for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_ps();
    auto pair = [&](int64_t m, __m256* acc) {
      const uint8_t* blk = row + 2 * m * Blk::kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead), _MM_HINT_T0);
      b32q_pair<Blk, T>(blk, A, m, 2 * m + 1 < nb, acc);
    };
    if constexpr (T <= 4) {
      int64_t m = 0;
      for (; m + 2 <= np; m += 2) {
        pair(m, lo);
        pair(m + 1, hi);
      }
      if (m < np) pair(m, lo);
    } else {
      for (int64_t m = 0; m < np; m += 2) pair(m, lo);
      for (int64_t m = 1; m < np; m += 2) pair(m, hi);
    }
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(lo[t], hi[t]);
  }
}

template <class Blk>
void rows_b32q(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  STRATA_CHECK(a.q32.qp, "matmul: ", type_name(W.type), " rows not in the SIMD kernels' pair layout");
  with_rows(a.T, [&](auto t) { rows_b32q_t<Blk, decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

inline RowsFn b32q_rows_fn(uint32_t type) {
  switch (type) {
    case GGML_Q4_0: return rows_b32q<B32Q4_0>;
    case GGML_Q4_1: return rows_b32q<B32Q4_1>;
    case GGML_Q5_0: return rows_b32q<B32Q5_0>;
    case GGML_Q5_1: return rows_b32q<B32Q5_1>;
    case GGML_IQ4_NL: return rows_b32q<B32Iq4Nl>;
    case GGML_MXFP4: return rows_b32q<B32Mxfp4>;
    default: return nullptr;
  }
}

}  // namespace
}  // namespace strata
