// The fused strip form of dn_rows (state/deltanet_state.h) for one SIMD width, shared by the AVX-512 and AVX2
// builds (kernels/cpu/deltanet_avx512.cpp, deltanet_avx2.cpp): strips of kL vectors of columns with m and o
// in registers, and the second half of row t (S += k m^T, o = S^T q) fused with the first half of row t+1
// (S *= eg, m = S^T k) in one pass over the strip: T + 1 passes instead of 2T, every S value stored once per
// row. Each element goes through the same multiplies and adds in the same order as the generic source
// (dn_rows_impl.h, which also handles the columns left over), so every build gives the same bits.
//
// V: the vector type's operations (reg, kW lanes, load, store, add, sub, mul, set1, zero), defined by the
// including file for the ISA it is compiled for. Internal linkage, like dn_rows_impl.h.
#pragma once
#include <cstdint>

#include "state/dn_rows_impl.h"

namespace strata {
namespace {

template <class V, int kL>
struct DnFused {
  using R = typename V::reg;
  static constexpr int kCols = kL * V::kW;  // columns per strip

  // m <- (v - m) * beta
  static inline void finish_m(R* m, const DnRow& Rw, int64_t j0) {
    const R beta = V::set1(Rw.beta);
    for (int i = 0; i < kL; i++) m[i] = V::mul(V::sub(V::load(Rw.v + j0 + V::kW * i), m[i]), beta);
  }

  // First half of row Rw: dst = src * eg, m = (v - dst^T k) * beta.
  static inline void first_half(const float* src, float* dst, const DnRow& Rw, int64_t dk, int64_t dv, int64_t j0,
                                R* m) {
    const float* __restrict kp = Rw.k;
    const R eg = V::set1(Rw.eg);
    for (int i = 0; i < kL; i++) m[i] = V::zero();
    for (int64_t a = 0; a < dk; a++) {
      const R ka = V::set1(kp[a]);
      for (int i = 0; i < kL; i++) {
        const R s = V::mul(V::load(src + a * dv + j0 + V::kW * i), eg);
        V::store(dst + a * dv + j0 + V::kW * i, s);
        m[i] = V::add(m[i], V::mul(s, ka));
      }
    }
    finish_m(m, Rw, j0);
  }

  // Second half of row Rw (s = cur + k m; o += s q when READ), then, when NEXT, the first half of row N on s
  // (stored to nxt; s itself also kept in cur when KEEP, i.e. when N moves to the working copy).
  template <bool READ, bool NEXT, bool KEEP>
  static inline void fused_pass(float* cur, float* nxt, const DnRow& Rw, const DnRow& N, int64_t dk, int64_t dv,
                                int64_t j0, R* m) {
    const float* __restrict kp = Rw.k;
    const float* __restrict qp = Rw.q;
    const float* __restrict knp = N.k;
    const R egn = V::set1(N.eg);
    R o[kL], mn[kL];
    for (int i = 0; i < kL; i++) o[i] = mn[i] = V::zero();
    for (int64_t a = 0; a < dk; a++) {
      const R ka = V::set1(kp[a]);
      R qa, kn;
      if (READ) qa = V::set1(qp[a]);
      if (NEXT) kn = V::set1(knp[a]);
      for (int i = 0; i < kL; i++) {
        float* c = cur + a * dv + j0 + V::kW * i;
        const R s = V::add(V::load(c), V::mul(ka, m[i]));
        if (READ) o[i] = V::add(o[i], V::mul(s, qa));
        if (!NEXT || KEEP) V::store(c, s);
        if (NEXT) {
          const R s2 = V::mul(s, egn);
          V::store(nxt + a * dv + j0 + V::kW * i, s2);
          mn[i] = V::add(mn[i], V::mul(s2, kn));
        }
      }
    }
    if (READ)
      for (int i = 0; i < kL; i++) V::store(Rw.o + j0 + V::kW * i, o[i]);
    if (NEXT) {
      for (int i = 0; i < kL; i++) m[i] = mn[i];
      finish_m(m, N, j0);
    }
  }

  static void strip(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv,
                    int64_t j0) {
    auto dst = [&](int t) { return t < n_src ? S : S_work; };
    R m[kL];
    first_half(S, dst(0), rows[0], dk, dv, j0, m);
    for (int t = 0; t < T; t++) {
      const DnRow Rw = rows[t];
      float* cur = dst(t);
      const bool read = Rw.o != nullptr;
      if (t + 1 == T) {
        if (read) fused_pass<true, false, false>(cur, cur, Rw, Rw, dk, dv, j0, m);
        else fused_pass<false, false, false>(cur, cur, Rw, Rw, dk, dv, j0, m);
        break;
      }
      const DnRow N = rows[t + 1];
      float* nxt = dst(t + 1);
      if (nxt != cur) {
        if (read) fused_pass<true, true, true>(cur, nxt, Rw, N, dk, dv, j0, m);
        else fused_pass<false, true, true>(cur, nxt, Rw, N, dk, dv, j0, m);
      } else {
        if (read) fused_pass<true, true, false>(cur, nxt, Rw, N, dk, dv, j0, m);
        else fused_pass<false, true, false>(cur, nxt, Rw, N, dk, dv, j0, m);
      }
    }
  }

  // Whole strips first, then the generic source for the rest (16-wide strips, then single columns).
  static void rows(float* S, float* S_work, const DnRow* rows_, int T, int n_src, int64_t dk, int64_t dv) {
    int64_t j0 = 0;
    for (; j0 + kCols <= dv; j0 += kCols) strip(S, S_work, rows_, T, n_src, dk, dv, j0);
    for (; j0 + 16 <= dv; j0 += 16) dn_strip<16>(S, S_work, rows_, T, n_src, dk, dv, j0);
    for (; j0 < dv; j0++) dn_strip<1>(S, S_work, rows_, T, n_src, dk, dv, j0);
  }
};

}  // namespace
}  // namespace strata
