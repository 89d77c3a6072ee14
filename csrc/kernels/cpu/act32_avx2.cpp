// AVX2 32-block activation quantizer: the same bytes as quantize_act32_ref (act32.h; the product rounds once,
// vcvtps2dq rounds half to even as nearbyint does in the default rounding mode).
#include <immintrin.h>

#include "kernels/act32.h"

namespace strata {

void quantize_act32_avx2(const float* x, int64_t ldx, int T, int64_t cols, QAct32Buf& buf, QAct32& out) {
  out = buf.view(T, cols);
  out.ldqp = 64 * ((out.nb + 1) / 2);
  if ((int64_t)buf.qp.size() < T * out.ldqp) buf.qp.resize(T * out.ldqp);
  out.qp = buf.qp.data();
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the packs' in-lane interleave
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
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.q.data() + t * out.ldq + b * 32), q);
      const __m256i qo = _mm256_xor_si256(q, _mm256_set1_epi8(-128));  // q + 128 (|q| <= 127)
      uint8_t* pair = buf.qp.data() + t * out.ldqp + 64 * (b / 2) + 16 * (b % 2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair), _mm256_castsi256_si128(qo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + 32), _mm256_extracti128_si256(qo, 1));
      buf.d[b * 8 + t] = amax / 127.f;
    }
  if (out.nb % 2)  // the odd last block's partner: q = 0
    for (int t = 0; t < T; t++) {
      uint8_t* pair = buf.qp.data() + t * out.ldqp + 64 * (out.nb / 2) + 16;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair), _mm_set1_epi8(-128));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + 32), _mm_set1_epi8(-128));
    }
}

}  // namespace strata
