// AVX-512 (VNNI) Q4_K kernel that multiplies the 4-bit codes as bytes (vpmaddubsw) instead of widening every
// weight to 16 bits and multiplying its scale in (kquants_avx512_impl.h DecQ4K: per block 8 widenings, 8
// vpmullw and 8 word broadcasts before the first product). The arithmetic of matmul.h is unchanged: the 16 lane
// sums P[k] (values v of the block with (v mod 32) / 2 == k) are exact integers, so any exact way of forming
// them gives the same bits. Here, per 64-value group c (sub-blocks 2c and 2c+1, whose codes share 32 bytes: low
// nibble = sub-block 2c, high nibble = 2c+1, same position):
//   weights: each 16-bit word k of the 32 bytes zero-extended to 32 bits and its nibbles spread so that the dword
//     holds [lo(2k), lo(2k+1), hi(2k), hi(2k+1)] (one vpmovzxwd, one shift, one vpternlogd);
//   activations: interleaved the same way once per call (bytes 4k, 4k+1 = values 2k, 2k+1 of sub-block 2c,
//     bytes 4k+2, 4k+3 = the same of sub-block 2c+1);
//   vpmaddubsw -> word 2k = sub-block 2c's pair k, word 2k+1 = sub-block 2c+1's pair k (codes <= 15, |x| <= 127:
//     <= 3810, never saturates); vpdpwssd with the dword (s_2c, s_2c+1) -> lane k += s_2c p + s_2c+1 p',
// so after the four groups lane k holds P[k], already in canonical lane order, and L = fma(d dx, P, L) and the
// mins term are computed exactly as the widening kernel does. Tested bit-identical with the scalar twin on
// fresh random blocks (tests/test_quant_kernels.py).
#include <immintrin.h>

#include <vector>

#include "kernels/cpu/act8_avx512.h"
#include "kernels/cpu/kq_common.h"
#include "kernels/iq_tables.h"
#include "kernels/cpu/reduce16.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"

namespace strata {

// kquants_avx512vbmi.cpp (built with VBMI; call only when vbmi_kernels_on()): an IQ2_XXS block's signed grid
// bytes, pair-interleaved as below (w[4]), and its scale pairs (s2[4]) from vectorised grid and sign lookups.
void iq2xxs_bytes_vbmi(const uint8_t* b, __m512i* w, int32_t* s2);

namespace {

using namespace kq;

// The rows as the byte kernels read them (QAct::il, made by prepare_act); a layout other than the one asked for
// is a dispatch defect (matmul.cpp interleave_for), never read as if it were right.
inline const int8_t* interleaved(const QAct& q, bool offset) {
  STRATA_CHECK(q.il && q.il_offset == offset, "AVX-512 byte kernel: activation rows not interleaved",
               offset ? " as q + 128" : "", " (matmul.cpp interleave_for)");
  return q.il;
}

template <bool kVnni>
inline __m512i dot_pairs(__m512i acc, __m512i p, __m512i s) {
  if constexpr (kVnni) return _mm512_dpwssd_epi32(acc, p, s);
  else return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}

// A Q4_K block's header (k4_head_simd) and its codes spread for vpmaddubsw: w[c], dword k = [lo(2k), lo(2k+1),
// hi(2k), hi(2k+1)] of group c's 32 bytes (x | x << 12 keeps each nibble once under 0x0F0F0F0F).
inline void q4k_bytes(const uint8_t* blk, __m128& ddm, __m128i& sc16, __m128i& m16, __m512i* w) {
  k4_head_simd(blk, ddm, sc16, m16);
  const __m512i nib = _mm512_set1_epi32(0x0F0F0F0F);
  for (int c = 0; c < 4; c++) {
    const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c)));
    w[c] = _mm512_ternarylogic_epi32(x, _mm512_slli_epi32(x, 12), nib, 0xA8);  // (x | y) & nib
  }
}

template <bool kVnni, int T>
void rows_q4k8_t(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int kBytes = 144;
  const int64_t nb = W.cols / QK_K;
  const int64_t cols = a.q.cols;
  const int8_t* xi = interleaved(a.q, false);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t* row = W.data + r * W.row_bytes;
    __m512 L[T];
    for (int t = 0; t < T; t++) L[t] = _mm512_setzero_ps();
    __m256 Lm = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* blk = row + b * kBytes;
      prefetch_ahead<kBytes>(blk);
      __m128 ddm;
      __m128i sc16, m16;
      __m512i w[4];
      q4k_bytes(blk, ddm, sc16, m16, w);
      const float d = _mm_cvtss_f32(ddm), dmin = _mm_cvtss_f32(_mm_movehdup_ps(ddm));
      // dword c of sc16 is (s_2c, s_2c+1): broadcast to every lane
      const __m512i scz = _mm512_castsi128_si512(sc16);
      const __m512i s01 = _mm512_permutexvar_epi32(_mm512_set1_epi32(0), scz);
      const __m512i s23 = _mm512_permutexvar_epi32(_mm512_set1_epi32(1), scz);
      const __m512i s45 = _mm512_permutexvar_epi32(_mm512_set1_epi32(2), scz);
      const __m512i s67 = _mm512_permutexvar_epi32(_mm512_set1_epi32(3), scz);
      const float* dx = a.q.d + b * 8;
      const int16_t* bs = a.q.bsum + b * 64;  // [pair of sub-blocks][row][2] (quants.h)
      for (int t = 0; t < T; t++) {
        const int8_t* q = xi + t * cols + b * QK_K;
        __m512i acc = _mm512_madd_epi16(_mm512_maddubs_epi16(w[0], _mm512_load_si512(q)), s01);
        acc = dot_pairs<kVnni>(acc, _mm512_maddubs_epi16(w[1], _mm512_load_si512(q + 64)), s23);
        acc = dot_pairs<kVnni>(acc, _mm512_maddubs_epi16(w[2], _mm512_load_si512(q + 128)), s45);
        acc = dot_pairs<kVnni>(acc, _mm512_maddubs_epi16(w[3], _mm512_load_si512(q + 192)), s67);
        L[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * dx[t]), _mm512_cvtepi32_ps(acc), L[t]);
      }
      Lm = mins_fma(m16, bs, dmin, dx, Lm);  // the mins of every row at once, as the widening kernel does
    }
    alignas(32) float lm[8];
    _mm256_store_ps(lm, Lm);
    for (int t = 0; t < T; t++) y[t * ldy + r] = reduce16(L[t]) - lm[t];
  }
}

template <bool kVnni>
void rows_q4k8(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_rows(a.T, [&](auto t) { rows_q4k8_t<kVnni, decltype(t)::value>(W, a, y, ldy, r0, r1); });
}

// Many passes (a prompt window): kPanelRows weight rows decoded once into a panel (their spread codes, scale
// pairs and header) and multiplied from it into every pass, each output element by exactly rows_q4k8_t's
// operations (the stored registers reload unchanged). Half the activation bytes of the widening panel path
// (kquants_avx512_impl.h rows_kq_many) per product.
struct alignas(64) Panel8 {
  __m512i w[4];
  __m512i init;  // signed weights: the lane sums' start, -128 * (the same sums over the weights alone)
  int32_t s2[4];
  __m128i m16;
  float d, dmin;
};
constexpr int64_t kPanelRows = 8;

template <bool kVnni, bool kSigned, int T>
void panel_row8(const Panel8* pb, int64_t nb, const Act& a, const int8_t* xi, float* y, int64_t ldy, int64_t r) {
  const int64_t cols = a.q.cols;
  __m512 L[T];
  for (int t = 0; t < T; t++) L[t] = _mm512_setzero_ps();
  __m256 Lm = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const Panel8& B = pb[b];
    const __m512i w0 = _mm512_load_si512(&B.w[0]), w1 = _mm512_load_si512(&B.w[1]);
    const __m512i w2 = _mm512_load_si512(&B.w[2]), w3 = _mm512_load_si512(&B.w[3]);
    const __m512i s01 = _mm512_set1_epi32(B.s2[0]), s23 = _mm512_set1_epi32(B.s2[1]);
    const __m512i s45 = _mm512_set1_epi32(B.s2[2]), s67 = _mm512_set1_epi32(B.s2[3]);
    const float* dx = a.q.d + b * 8;
    const int16_t* bs = a.q.bsum + b * 64;
    const RowFactors dd(B.d, dx);
    for (int t = 0; t < T; t++) {
      const int8_t* q = xi + t * cols + b * QK_K;
      // (signed weights: the bytes are the weights, the activations the unsigned operand q + 128)
      const __m512i p0 = kSigned ? _mm512_maddubs_epi16(_mm512_load_si512(q), w0) : _mm512_maddubs_epi16(w0, _mm512_load_si512(q));
      const __m512i p1 = kSigned ? _mm512_maddubs_epi16(_mm512_load_si512(q + 64), w1) : _mm512_maddubs_epi16(w1, _mm512_load_si512(q + 64));
      const __m512i p2 = kSigned ? _mm512_maddubs_epi16(_mm512_load_si512(q + 128), w2) : _mm512_maddubs_epi16(w2, _mm512_load_si512(q + 128));
      const __m512i p3 = kSigned ? _mm512_maddubs_epi16(_mm512_load_si512(q + 192), w3) : _mm512_maddubs_epi16(w3, _mm512_load_si512(q + 192));
      __m512i acc = kSigned ? dot_pairs<kVnni>(_mm512_load_si512(&B.init), p0, s01) : _mm512_madd_epi16(p0, s01);
      acc = dot_pairs<kVnni>(acc, p1, s23);
      acc = dot_pairs<kVnni>(acc, p2, s45);
      acc = dot_pairs<kVnni>(acc, p3, s67);
      L[t] = _mm512_fmadd_ps(_mm512_set1_ps(dd[t]), _mm512_cvtepi32_ps(acc), L[t]);
    }
    if constexpr (!kSigned) Lm = mins_fma(B.m16, bs, B.dmin, dx, Lm);  // (signed weights: no mins)
  }
  alignas(32) float lm[8];
  _mm256_store_ps(lm, Lm);
  for (int t = 0; t < T; t++) y[t * ldy + r] = kSigned ? reduce16(L[t]) : reduce16(L[t]) - lm[t];
}

// A prompt window's passes through byte panels: kPanelRows weight rows at a time decoded by decode(blk, entry)
// into the panel, then every pass (its rows interleaved once per call, + 128 for signed weights).
template <bool kVnni, bool kSigned, int kBytes, class Decode>
void rows_many8(const MatView& W, const Act* pass, int np, float* y, int64_t ldy, int64_t r0, int64_t r1,
                Decode&& decode) {
  const int64_t nb = W.cols / QK_K;
  thread_local std::vector<Panel8> panel;  // [kPanelRows][nb]
  if ((int64_t)panel.size() < kPanelRows * nb) panel.resize(kPanelRows * nb);
  for (int p = 0; p < np; p++) interleaved(pass[p].q, kSigned);  // each pass's rows, as prepared
  for (int64_t rb = r0; rb < r1; rb += kPanelRows) {
    const int64_t re = rb + kPanelRows < r1 ? rb + kPanelRows : r1;
    for (int64_t r = rb; r < re; r++) {
      const uint8_t* row = W.data + r * W.row_bytes;
      Panel8* pb = panel.data() + (r - rb) * nb;
      for (int64_t b = 0; b < nb; b++) {
        prefetch_ahead<kBytes>(row + b * kBytes);
        decode(row + b * kBytes, pb[b]);
      }
    }
    for (int p = 0; p < np; p++)
      with_rows(pass[p].T, [&](auto t) {
        for (int64_t r = rb; r < re; r++)
          panel_row8<kVnni, kSigned, decltype(t)::value>(panel.data() + (r - rb) * nb, nb, pass[p],
                                                         pass[p].q.il,
                                                         y + (int64_t)p * kMaxRowsPerPass * ldy, ldy, r);
      });
  }
}

template <bool kVnni>
void rows_many_q4k8(const MatView& W, const Act* pass, int np, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  rows_many8<kVnni, false, 144>(W, pass, np, y, ldy, r0, r1, [&](const uint8_t* blk, Panel8& P) {
    __m128 ddm;
    __m128i sc16;
    q4k_bytes(blk, ddm, sc16, P.m16, P.w);
    P.d = _mm_cvtss_f32(ddm);
    P.dmin = _mm_cvtss_f32(_mm_movehdup_ps(ddm));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(P.s2), sc16);
  });
}

// IQ2_XXS prompt windows: w = (2s+1) * grid * sign has signed bytes (|grid * sign| <= 43), so the activations
// are the unsigned operand, q + 128, and every lane starts from -128 times the same lane sums over the weights
// alone (exact integers: P[k] = sum s (q + 128) w - 128 sum s w); pairs <= 2 * 255 * 43 < 2^15, no saturation.
// The panel holds, per 64-value group c, the signed grid bytes of sub-blocks 2c, 2c+1 with their words k
// interleaved (dword k = pair k of 2c, pair k of 2c+1) and the scale pair (2s+1 of each).
template <bool kVnni>
void rows_many_iq2xxs8(const MatView& W, const Act* pass, int np, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  alignas(64) int16_t il16[32];
  for (int k = 0; k < 16; k++) {
    il16[2 * k] = (int16_t)k;             // word k of sub-block 2c
    il16[2 * k + 1] = (int16_t)(32 + k);  // word k of sub-block 2c + 1 (the second table)
  }
  const __m512i il = _mm512_load_si512(il16);
  const __m512i ones = _mm512_set1_epi8(1);
  const bool vbmi = vbmi_kernels_on();
  rows_many8<kVnni, true, 66>(W, pass, np, y, ldy, r0, r1, [&](const uint8_t* blk, Panel8& P) {
    P.d = h2f(blk) * 0.125f;
    P.dmin = 0.f;
    if (vbmi) {
      iq2xxs_bytes_vbmi(blk, P.w, P.s2);
    } else {
      __m256i sg[8];
      int16_t sc[8];
      for (int ib = 0; ib < 8; ib++) {
        const uint8_t* q = blk + 2 + 8 * ib;
        const uint32_t aux1 = u32_at(q + 4);
        const __m256i g = _mm256_set_epi64x((long long)kIq2xxsGrid[q[3]], (long long)kIq2xxsGrid[q[2]],
                                            (long long)kIq2xxsGrid[q[1]], (long long)kIq2xxsGrid[q[0]]);
        sg[ib] = iq_signed(g, aux1);
        sc[ib] = (int16_t)(2 * (aux1 >> 28) + 1);
      }
      for (int c = 0; c < 4; c++) {
        P.w[c] = _mm512_permutex2var_epi16(_mm512_castsi256_si512(sg[2 * c]), il, _mm512_castsi256_si512(sg[2 * c + 1]));
        P.s2[c] = (int32_t)(uint16_t)sc[2 * c] | (int32_t)sc[2 * c + 1] << 16;
      }
    }
    __m512i wsum = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++)
      wsum = dot_pairs<kVnni>(wsum, _mm512_maddubs_epi16(ones, P.w[c]), _mm512_set1_epi32(P.s2[c]));
    P.init = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(wsum, 7));
  });
}

}  // namespace

void interleave_act_avx512(QActBuf& buf, QAct& a, bool offset) {
  const size_t n = (size_t)a.T * a.cols;
  if (buf.il.size() < n) buf.il.resize(n);
  if (offset) interleave_act<true>(a, a.T, buf.il.data());
  else interleave_act<false>(a, a.T, buf.il.data());
  a.il = buf.il.data();
  a.il_offset = offset;
}

RowsFn rows_fn_kq8_avx512(uint32_t type) {
  if (type != GGML_Q4_K) return nullptr;
  return cpu_has_avx512vnni() ? rows_q4k8<true> : rows_q4k8<false>;
}

RowsManyFn rows_many_fn_kq8_avx512(uint32_t type) {
  const bool vnni = cpu_has_avx512vnni();
  switch (type) {
    case GGML_Q4_K: return vnni ? rows_many_q4k8<true> : rows_many_q4k8<false>;
    case GGML_IQ2_XXS: return vnni ? rows_many_iq2xxs8<true> : rows_many_iq2xxs8<false>;
    default: return nullptr;
  }
}

}  // namespace strata
