// dn_rows with AVX-512 (see state/dn_rows_impl.h): 64-column strips written with intrinsics so that m
// and o stay in registers (the compiler spills the generic template's arrays); the same multiplies
// and adds in the same order as the generic source, which handles the remaining columns.
#include <immintrin.h>

#include "state/dn_rows_impl.h"

namespace strata {

namespace {

void dn_strip64(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv, int64_t j0) {
  float* Sc = S;
  for (int t = 0; t < T; t++) {
    if (t == n_src) {
      for (int64_t a = 0; a < dk; a++)
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(S_work + a * dv + j0 + 16 * i, _mm512_loadu_ps(S + a * dv + j0 + 16 * i));
      Sc = S_work;
    }
    const DnRow R = rows[t];  // a copy: the stores into S below must not make the compiler reload it
    const float* __restrict kp = R.k;
    const float* __restrict qp = R.q;
    const __m512 eg = _mm512_set1_ps(R.eg);
    __m512 m[4];
    for (int i = 0; i < 4; i++) m[i] = _mm512_setzero_ps();
    for (int64_t a = 0; a < dk; a++) {
      float* row = Sc + a * dv + j0;
      const __m512 ka = _mm512_set1_ps(kp[a]);
      for (int i = 0; i < 4; i++) {
        const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * i), eg);
        _mm512_storeu_ps(row + 16 * i, s);
        m[i] = _mm512_add_ps(m[i], _mm512_mul_ps(s, ka));
      }
    }
    const __m512 beta = _mm512_set1_ps(R.beta);
    for (int i = 0; i < 4; i++) m[i] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(R.v + j0 + 16 * i), m[i]), beta);
    if (R.o) {
      __m512 o[4];
      for (int i = 0; i < 4; i++) o[i] = _mm512_setzero_ps();
      for (int64_t a = 0; a < dk; a++) {
        float* row = Sc + a * dv + j0;
        const __m512 ka = _mm512_set1_ps(kp[a]), qa = _mm512_set1_ps(qp[a]);
        for (int i = 0; i < 4; i++) {
          const __m512 s = _mm512_add_ps(_mm512_loadu_ps(row + 16 * i), _mm512_mul_ps(ka, m[i]));
          _mm512_storeu_ps(row + 16 * i, s);
          o[i] = _mm512_add_ps(o[i], _mm512_mul_ps(s, qa));
        }
      }
      for (int i = 0; i < 4; i++) _mm512_storeu_ps(R.o + j0 + 16 * i, o[i]);
    } else {
      for (int64_t a = 0; a < dk; a++) {
        float* row = Sc + a * dv + j0;
        const __m512 ka = _mm512_set1_ps(kp[a]);
        for (int i = 0; i < 4; i++)
          _mm512_storeu_ps(row + 16 * i, _mm512_add_ps(_mm512_loadu_ps(row + 16 * i), _mm512_mul_ps(ka, m[i])));
      }
    }
  }
}

}  // namespace

void dn_rows_avx512(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) {
  int64_t j0 = 0;
  for (; j0 + 64 <= dv; j0 += 64) dn_strip64(S, S_work, rows, T, n_src, dk, dv, j0);
  for (; j0 + 16 <= dv; j0 += 16) dn_strip<16>(S, S_work, rows, T, n_src, dk, dv, j0);
  for (; j0 < dv; j0++) dn_strip<1>(S, S_work, rows, T, n_src, dk, dv, j0);
}

}  // namespace strata
