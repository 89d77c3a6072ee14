// AVX2 32-block activation quantizer: the same bytes as quantize_act32_ref (act32.h; the product rounds once,
// vcvtps2dq rounds half to even as nearbyint does in the default rounding mode).
#include <immintrin.h>

#include "kernels/act32.h"

namespace strata {

void quantize_act32_avx2(const float* x, int64_t ldx, int T, int64_t cols, QAct32Buf& buf, QAct32& out) {
  out = buf.view(T, cols);
  out.np = (out.nb + 1) / 2;
  const int64_t pairs = T * out.np;
  if ((int64_t)buf.qp.size() < pairs * 64) buf.qp.resize(pairs * 64);
  if ((int64_t)buf.cq.size() < pairs * 8) buf.cq.resize(pairs * 8);
  if ((int64_t)buf.dp.size() < pairs * 8) buf.dp.resize(pairs * 8);
  if ((int64_t)buf.sq.size() < pairs * 8) buf.sq.resize(pairs * 8);
  out.sq = buf.sq.data();
  out.qp = buf.qp.data();
  out.cq = buf.cq.data();
  out.dp = buf.dp.data();
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the packs' in-lane interleave
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int t = 0; t < T; t++)
    for (int64_t b = 0; b < out.nb; b++) {
      const float* xb = x + t * ldx + b * 32;
      const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
                   v3 = _mm256_loadu_ps(xb + 24);
      const __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                      _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float amax = _mm_cvtss_f32(m4);
      const __m256 is = _mm256_set1_ps(amax > kAct32Tiny ? 127.f / amax : 0.f);
      const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(is, v0)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(is, v1));
      const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(is, v2)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(is, v3));
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
      const __m256i q = _mm256_permutevar8x32_epi32(p, order);
      const float dx = amax / 127.f;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.q.data() + t * out.ldq + b * 32), q);
      buf.d[b * 8 + t] = dx;
      // the pair layout: q's halves, 16 * its lane sums (quads k and k + 4), dx in the block's 4 lanes
      const int64_t at = t * out.np + b / 2;
      const int h = (int)(b % 2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(buf.qp.data() + at * 64 + 16 * h), _mm256_castsi256_si128(q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(buf.qp.data() + at * 64 + 32 + 16 * h), _mm256_extracti128_si256(q, 1));
      const __m256i quads = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
      const __m128i lanes = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(buf.cq.data() + at * 8 + 4 * h), _mm_slli_epi32(lanes, 4));
      _mm_storeu_ps(buf.dp.data() + at * 8 + 4 * h, _mm_set1_ps(dx));
      _mm_storeu_ps(buf.sq.data() + at * 8 + 4 * h, _mm_cvtepi32_ps(lanes));
    }
  if (out.nb % 2)  // the odd last block's partner: q = 0, dx = 0
    for (int t = 0; t < T; t++) {
      const int64_t at = t * out.np + out.nb / 2;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(buf.qp.data() + at * 64 + 16), _mm_setzero_si128());
      _mm_storeu_si128(reinterpret_cast<__m128i*>(buf.qp.data() + at * 64 + 48), _mm_setzero_si128());
      _mm_storeu_si128(reinterpret_cast<__m128i*>(buf.cq.data() + at * 8 + 4), _mm_setzero_si128());
      _mm_storeu_ps(buf.dp.data() + at * 8 + 4, _mm_setzero_ps());
      _mm_storeu_ps(buf.sq.data() + at * 8 + 4, _mm_setzero_ps());
    }
}

}  // namespace strata
