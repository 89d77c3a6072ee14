// AVX-512 attention (attend.h): per head, scores as 16-lane FMA dots (four cells at a time for
// independent chains) reduced with the fixed tree of reduce16; softmax exponentials by exp_shift (rowops.h);
// the output as FMA over cells in increasing order, the head's hd values held in registers.
#include <immintrin.h>

#include <cmath>

#include "kernels/attend.h"
#include "kernels/rowops.h"

namespace strata {

namespace {

inline float reduce16(__m512 v) {
  __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

template <int NC>  // NC = hd / 16
void attend_t(const AttendArgs& args, float* sc) {
  const AttendArgs a = args;  // a copy: the stores into sc must not make the compiler reload the fields
  for (int h = 0; h < a.nq; h++) {
    const float* qp = a.q + h * a.ldq;
    __m512 q[NC];
    for (int i = 0; i < NC; i++) q[i] = _mm512_loadu_ps(qp + 16 * i);
    int64_t c = 0;
    for (; c + 4 <= a.n; c += 4) {
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      const float* k0 = a.k + c * a.ldkv;
      for (int i = 0; i < NC; i++) {
        s0 = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(k0 + 16 * i), s0);
        s1 = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(k0 + a.ldkv + 16 * i), s1);
        s2 = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(k0 + 2 * a.ldkv + 16 * i), s2);
        s3 = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(k0 + 3 * a.ldkv + 16 * i), s3);
      }
      sc[c] = reduce16(s0) * a.scale;
      sc[c + 1] = reduce16(s1) * a.scale;
      sc[c + 2] = reduce16(s2) * a.scale;
      sc[c + 3] = reduce16(s3) * a.scale;
    }
    for (; c < a.n; c++) {
      __m512 s0 = _mm512_setzero_ps();
      const float* k0 = a.k + c * a.ldkv;
      for (int i = 0; i < NC; i++) s0 = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(k0 + 16 * i), s0);
      sc[c] = reduce16(s0) * a.scale;
    }
    float mx = -INFINITY;
    for (int64_t j = 0; j < a.n; j++) mx = sc[j] > mx ? sc[j] : mx;
    float sum = 0.f;
    exp_shift(sc, mx, a.n);
    for (int64_t j = 0; j < a.n; j++) sum += sc[j];
    const float inv = 1.f / sum;
    __m512 o[NC];
    for (int i = 0; i < NC; i++) o[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < a.n; j++) {
      const __m512 p = _mm512_set1_ps(sc[j] * inv);
      const float* vp = a.v + j * a.ldkv;
      for (int i = 0; i < NC; i++) o[i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vp + 16 * i), o[i]);
    }
    float* op = a.o + h * a.ldo;
    for (int i = 0; i < NC; i++) _mm512_storeu_ps(op + 16 * i, o[i]);
  }
}

}  // namespace

void attend_avx512(const AttendArgs& a, float* sc) {
  switch (a.hd) {
    case 64: return attend_t<4>(a, sc);
    case 128: return attend_t<8>(a, sc);
    case 256: return attend_t<16>(a, sc);
    default: return attend_ref(a, sc);
  }
}

}  // namespace strata
