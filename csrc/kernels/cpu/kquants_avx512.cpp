// AVX-512 int8-activation kernels for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ3_XXS, IQ4_XS (matmul.h states the arithmetic).
// A weight block is decoded once into eight 32 x int16 registers w[j] (sub-block j, integer form of
// quants.h) and multiplied into all T rows: vpdpwssd (VNNI) or vpmaddwd + vpaddd, which give the same
// exact int32 lane sums P[k] (lane k takes values 2k, 2k+1 of every sub-block).
#include <immintrin.h>

#include "kernels/cpu/kquants_avx512_impl.h"

namespace strata {

RowsFn rows_fn_kq_avx512(uint32_t type) {
  switch (type) {
    case GGML_Q2_K: return pick<DecQ2K>();
    case GGML_Q3_K: return pick<DecQ3K>();
    case GGML_Q4_K: return pick<DecQ4K>();
    case GGML_Q5_K: return pick<DecQ5K>();
    case GGML_Q6_K: return pick<DecQ6K>();
    case GGML_IQ2_XXS: return pick<DecIQ2XXS>();
    case GGML_IQ3_XXS: return pick<DecIQ3XXS>();
    case GGML_IQ4_XS: return pick<DecIQ4XS>();
    case GGML_IQ2_XS: return pick<DecIQ2XS>();
    case GGML_IQ2_S: return pick<DecIQ2S>();
    case GGML_IQ3_S: return pick<DecIQ3S>();
    case GGML_IQ1_S: return pick<DecIQ1S>();
    case GGML_IQ1_M: return pick<DecIQ1M>();
    default: return nullptr;
  }
}

RowsManyFn rows_many_fn_kq_avx512(uint32_t type) {
  switch (type) {
    case GGML_Q3_K: return pick_many<DecQ3K>();
    case GGML_Q4_K: return pick_many<DecQ4K>();
    case GGML_Q5_K: return pick_many<DecQ5K>();
    case GGML_Q6_K: return pick_many<DecQ6K>();
    case GGML_IQ2_XXS: return pick_many<DecIQ2XXS>();
    case GGML_IQ3_XXS: return pick_many<DecIQ3XXS>();
    case GGML_IQ4_XS: return pick_many<DecIQ4XS>();
    case GGML_IQ2_XS: return pick_many<DecIQ2XS>();
    case GGML_IQ2_S: return pick_many<DecIQ2S>();
    case GGML_IQ3_S: return pick_many<DecIQ3S>();
    case GGML_IQ1_S: return pick_many<DecIQ1S>();
    case GGML_IQ1_M: return pick_many<DecIQ1M>();
    default: return nullptr;
  }
}

// Same bytes as quantize_act_ref: max|x| is exact in any order, 127/amax and iscale*x are single IEEE
// operations, and vcvtps2dq rounds half to even like nearbyint under the default rounding mode.
void quantize_act_avx512(const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, QAct& out) {
  out = buf.view(T, cols);
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int t = 0; t < T; t++)
    for (int64_t b = 0; b < out.nb; b++) {
      const float* xb = x + t * ldx + b * QK_K;
      int16_t* qb = buf.q.data() + t * out.ldq + b * QK_K;
      __m512 mx = _mm512_setzero_ps();
      for (int i = 0; i < QK_K; i += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_loadu_ps(xb + i), absmask));
      const float amax = _mm512_reduce_max_ps(mx);
      const __m512 is = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      for (int j = 0; j < 8; j++) {
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(xb + 32 * j)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(xb + 32 * j + 16)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 32 * j), _mm512_cvtepi32_epi16(q0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 32 * j + 16), _mm512_cvtepi32_epi16(q1));
        buf.bsum[(b * 4 + j / 2) * 16 + 2 * t + (j & 1)] = (int16_t)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      }
      buf.d[b * 8 + t] = amax / 127.f;
    }
}

}  // namespace strata
