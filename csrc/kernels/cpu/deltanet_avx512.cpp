// dn_rows with AVX-512 (see state/dn_rows_impl.h): 64-column strips with intrinsics so that m and o stay
// in registers, and the second half of row t (S += k m^T, o = S^T q) fused with the first half of row
// t+1 (S *= eg, m = S^T k) in one pass over the strip: T + 1 passes instead of 2T, every S value stored
// once per row. Each element still goes through the same multiplies and adds in the same order as the
// generic source (which handles the remaining columns), so the results are the same bits.
#include <immintrin.h>

#include "state/dn_rows_impl.h"

namespace strata {

namespace {

constexpr int kL = 4;  // zmm per strip: 64 columns

// m <- (v - m) * beta
inline void finish_m(__m512* m, const DnRow& R, int64_t j0) {
  const __m512 beta = _mm512_set1_ps(R.beta);
  for (int i = 0; i < kL; i++) m[i] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(R.v + j0 + 16 * i), m[i]), beta);
}

// First half of row R: dst = src * eg, m = (v - dst^T k) * beta.
inline void first_half(const float* src, float* dst, const DnRow& R, int64_t dk, int64_t dv, int64_t j0, __m512* m) {
  const float* __restrict kp = R.k;
  const __m512 eg = _mm512_set1_ps(R.eg);
  for (int i = 0; i < kL; i++) m[i] = _mm512_setzero_ps();
  for (int64_t a = 0; a < dk; a++) {
    const __m512 ka = _mm512_set1_ps(kp[a]);
    for (int i = 0; i < kL; i++) {
      const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(src + a * dv + j0 + 16 * i), eg);
      _mm512_storeu_ps(dst + a * dv + j0 + 16 * i, s);
      m[i] = _mm512_add_ps(m[i], _mm512_mul_ps(s, ka));
    }
  }
  finish_m(m, R, j0);
}

// Second half of row R (s = cur + k m; o += s q when READ), then, when NEXT, the first half of row N on s
// (stored to nxt; s itself also kept in cur when KEEP, i.e. when N moves to the working copy).
template <bool READ, bool NEXT, bool KEEP>
inline void fused_pass(float* cur, float* nxt, const DnRow& R, const DnRow& N, int64_t dk, int64_t dv, int64_t j0,
                       __m512* m) {
  const float* __restrict kp = R.k;
  const float* __restrict qp = R.q;
  const float* __restrict knp = N.k;
  const __m512 egn = _mm512_set1_ps(N.eg);
  __m512 o[kL], mn[kL];
  for (int i = 0; i < kL; i++) o[i] = mn[i] = _mm512_setzero_ps();
  for (int64_t a = 0; a < dk; a++) {
    const __m512 ka = _mm512_set1_ps(kp[a]);
    __m512 qa, kn;
    if (READ) qa = _mm512_set1_ps(qp[a]);
    if (NEXT) kn = _mm512_set1_ps(knp[a]);
    for (int i = 0; i < kL; i++) {
      float* c = cur + a * dv + j0 + 16 * i;
      const __m512 s = _mm512_add_ps(_mm512_loadu_ps(c), _mm512_mul_ps(ka, m[i]));
      if (READ) o[i] = _mm512_add_ps(o[i], _mm512_mul_ps(s, qa));
      if (!NEXT || KEEP) _mm512_storeu_ps(c, s);
      if (NEXT) {
        const __m512 s2 = _mm512_mul_ps(s, egn);
        _mm512_storeu_ps(nxt + a * dv + j0 + 16 * i, s2);
        mn[i] = _mm512_add_ps(mn[i], _mm512_mul_ps(s2, kn));
      }
    }
  }
  if (READ)
    for (int i = 0; i < kL; i++) _mm512_storeu_ps(R.o + j0 + 16 * i, o[i]);
  if (NEXT) {
    for (int i = 0; i < kL; i++) m[i] = mn[i];
    finish_m(m, N, j0);
  }
}

void dn_strip64(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv, int64_t j0) {
  auto dst = [&](int t) { return t < n_src ? S : S_work; };
  __m512 m[kL];
  first_half(S, dst(0), rows[0], dk, dv, j0, m);
  for (int t = 0; t < T; t++) {
    const DnRow R = rows[t];
    float* cur = dst(t);
    const bool read = R.o != nullptr;
    if (t + 1 == T) {
      if (read) fused_pass<true, false, false>(cur, cur, R, R, dk, dv, j0, m);
      else fused_pass<false, false, false>(cur, cur, R, R, dk, dv, j0, m);
      break;
    }
    const DnRow N = rows[t + 1];
    float* nxt = dst(t + 1);
    if (nxt != cur) {
      if (read) fused_pass<true, true, true>(cur, nxt, R, N, dk, dv, j0, m);
      else fused_pass<false, true, true>(cur, nxt, R, N, dk, dv, j0, m);
    } else {
      if (read) fused_pass<true, true, false>(cur, nxt, R, N, dk, dv, j0, m);
      else fused_pass<false, true, false>(cur, nxt, R, N, dk, dv, j0, m);
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
