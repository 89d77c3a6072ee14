// The chunked gated delta rule (deltanet_chunked.h), one source compiled per ISA (state/deltanet_chunked.cpp,
// kernels/cpu/dn_chunked_avx2.cpp, dn_chunked_avx512.cpp). Every loop is elementwise along its innermost,
// contiguous dimension (the compiler vectorises it) and every value is a fixed sequence of float multiplies
// and adds (-ffp-contract=off), so every build gives the same bits. Internal linkage, like dn_rows_impl.h.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/rowops_impl.h"
#include "state/deltanet_chunked.h"

namespace strata {
namespace {

// y[0..n) += a * x[0..n)
inline void axpy_n(float* __restrict y, const float* __restrict x, float a, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = y[j] + a * x[j];
}

void dn_chunked_impl(float* S, const DnSeq& s, int T, int64_t dk, int64_t dv) {
  constexpr int C = kDnChunk;
  thread_local std::vector<float> buf;
  // G[C] | A[C][C] (k.k, then L, then W) | QK[C][C] | Kt[dk][C] | Kb[C][dk] -> Wk | Qg[C][dk] | Kd[C][dk] |
  // D[C][dv]
  const size_t need = (size_t)C + 2 * C * C + 4 * (size_t)C * dk + (size_t)C * dv;
  if (buf.size() < need) buf.resize(need);
  float* G = buf.data();
  float* A = G + C;
  float* QK = A + C * C;
  float* Kt = QK + C * C;
  float* Kb = Kt + C * dk;
  float* Qg = Kb + C * dk;
  float* Kd = Qg + C * dk;
  float* D = Kd + C * dk;
  for (int c0 = 0; c0 < T; c0 += C) {
    const int n = T - c0 < C ? T - c0 : C;  // rows in this chunk
    auto k = [&](int i) { return s.k + (int64_t)(c0 + i) * s.ldk; };
    auto v = [&](int i) { return s.v + (int64_t)(c0 + i) * s.ldv; };
    auto q = [&](int i) { return s.q + (int64_t)(c0 + i) * s.ldq; };
    auto beta = [&](int i) { return s.beta[(int64_t)(c0 + i) * s.ldgb]; };
    float acc = 0.f;
    for (int i = 0; i < n; i++) {
      acc = acc + s.g[(int64_t)(c0 + i) * s.ldgb];
      G[i] = acc;
    }
    // k.k and q.k for the chunk's pairs: K^T once, then rows of dot products accumulated over the dimension
    for (int64_t a = 0; a < dk; a++)
      for (int j = 0; j < n; j++) Kt[a * C + j] = k(j)[a];
    for (int i = 0; i < n; i++) {
      float* ai = A + i * C;
      float* qi = QK + i * C;
      for (int j = 0; j < n; j++) ai[j] = qi[j] = 0.f;
      const float* ki = k(i);
      const float* qv = q(i);
      for (int64_t a = 0; a < dk; a++) {
        axpy_n(ai, Kt + a * C, ki[a], i);       // j < i
        axpy_n(qi, Kt + a * C, qv[a], i + 1);   // j <= i
      }
      const float bi = beta(i), Gi = G[i];
      for (int j = 0; j < i; j++) ai[j] = bi * exp_inl(Gi - G[j]) * ai[j];   // L
      for (int j = 0; j <= i; j++) qi[j] = exp_inl(Gi - G[j]) * qi[j];
    }
    // W = (I + L)^-1, row by row in place: W_i = e_i - sum_{j < i} L[i][j] W_j (row j of W is final)
    for (int i = 0; i < n; i++) {
      float* wi = A + i * C;
      for (int j = 0; j < i; j++) {  // wi[j] still holds L[i][j]: take it before row j's terms overwrite it
        const float l = wi[j];
        wi[j] = 0.f;
        for (int c = 0; c < j; c++) wi[c] = wi[c] - l * A[j * C + c];
        wi[j] = wi[j] - l;  // W[j][j] = 1
      }
      wi[i] = 1.f;
      for (int c = i + 1; c < C; c++) wi[c] = 0.f;
    }
    // D = W (beta v) - (W (beta exp(G) k)) S0: first Wk = W (beta exp(G) k) into Kb, D = W (beta v)
    for (int i = 0; i < n; i++) {
      float* kb = Kb + i * dk;
      float* d = D + i * dv;
      for (int64_t a = 0; a < dk; a++) kb[a] = 0.f;
      for (int64_t j = 0; j < dv; j++) d[j] = 0.f;
      for (int j = 0; j <= i; j++) {
        const float w = A[i * C + j], bj = beta(j);
        axpy_n(kb, k(j), w * (bj * exp_inl(G[j])), dk);
        axpy_n(d, v(j), w * bj, dv);
      }
    }
    // D -= Wk S0 and O = (exp(G) q) S0 (both read the chunk's starting state)
    for (int i = 0; i < n; i++) {
      float* d = D + i * dv;
      float* o = s.o + (int64_t)(c0 + i) * s.ldo;
      const float* kb = Kb + i * dk;
      const float* qv = q(i);
      const float gi = exp_inl(G[i]);
      for (int64_t j = 0; j < dv; j++) o[j] = 0.f;
      for (int64_t a = 0; a < dk; a++) {
        const float* Sa = S + a * dv;
        axpy_n(d, Sa, -kb[a], dv);
        axpy_n(o, Sa, gi * qv[a], dv);
      }
    }
    // o_i += sum_{j <= i} exp(G_i - G_j) (q_i.k_j) d_j
    for (int i = 0; i < n; i++) {
      float* o = s.o + (int64_t)(c0 + i) * s.ldo;
      for (int j = 0; j <= i; j++) axpy_n(o, D + j * dv, QK[i * C + j], dv);
    }
    // S = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j d_j^T
    const float gl = G[n - 1], decay = exp_inl(gl);
    for (int j = 0; j < n; j++) {
      const float f = exp_inl(gl - G[j]);
      const float* kj = k(j);
      for (int64_t a = 0; a < dk; a++) Kd[j * dk + a] = f * kj[a];
    }
    for (int64_t a = 0; a < dk; a++) {
      float* Sa = S + a * dv;
      for (int64_t j = 0; j < dv; j++) Sa[j] = Sa[j] * decay;
      for (int j = 0; j < n; j++) axpy_n(Sa, D + j * dv, Kd[j * dk + a], dv);
    }
  }
}

}  // namespace
}  // namespace strata
