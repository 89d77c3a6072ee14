// The strip-mined DeltaNet window recurrence (dn_rows in deltanet_state.h), generic form: the whole of
// dn_rows in the baseline x86-64 build (deltanet_state.cpp), and the columns left over after the 64-wide
// intrinsic strips in the AVX-512 build (kernels/cpu/deltanet_avx512.cpp); dn_rows picks the build at run
// time. Only elementwise float multiplies and adds, never reassociated or contracted (-ffp-contract=off),
// so every build gives the same bits. Internal linkage: each including file gets its own copy, so the
// linker cannot mix the two builds.
#pragma once
#include <cstdint>

#include "state/deltanet_state.h"

namespace strata {
namespace {

// One strip of W columns [j0, j0 + W) through rows 0..T-1 (see dn_rows), W a compile-time width; the
// operations per element are those of dn_decay_delta and dn_update_read, in the same order.
template <int W>
void dn_strip(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv, int64_t j0) {
  float* Sc = S;
  for (int t = 0; t < T; t++) {
    if (t == n_src) {  // switch to the working copy: this strip of S as it stands now
      for (int64_t a = 0; a < dk; a++)
        for (int j = 0; j < W; j++) S_work[a * dv + j0 + j] = S[a * dv + j0 + j];
      Sc = S_work;
    }
    const DnRow R = rows[t];  // a copy: the stores into S below must not make the compiler reload it
    float m[W];
    for (int j = 0; j < W; j++) m[j] = 0.f;
    for (int64_t a = 0; a < dk; a++) {
      float* row = Sc + a * dv + j0;
      const float ka = R.k[a];
      for (int j = 0; j < W; j++) {
        row[j] = row[j] * R.eg;
        m[j] = m[j] + row[j] * ka;
      }
    }
    for (int j = 0; j < W; j++) m[j] = (R.v[j0 + j] - m[j]) * R.beta;
    if (R.o) {
      float o[W];
      for (int j = 0; j < W; j++) o[j] = 0.f;
      for (int64_t a = 0; a < dk; a++) {
        float* row = Sc + a * dv + j0;
        const float ka = R.k[a], qa = R.q[a];
        for (int j = 0; j < W; j++) {
          row[j] = row[j] + ka * m[j];
          o[j] = o[j] + row[j] * qa;
        }
      }
      for (int j = 0; j < W; j++) R.o[j0 + j] = o[j];
    } else {
      for (int64_t a = 0; a < dk; a++) {
        float* row = Sc + a * dv + j0;
        const float ka = R.k[a];
        for (int j = 0; j < W; j++) row[j] = row[j] + ka * m[j];
      }
    }
  }
}


void dn_rows_impl(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) {
  int64_t j0 = 0;
  for (; j0 + 64 <= dv; j0 += 64) dn_strip<64>(S, S_work, rows, T, n_src, dk, dv, j0);
  for (; j0 + 16 <= dv; j0 += 16) dn_strip<16>(S, S_work, rows, T, n_src, dk, dv, j0);
  for (; j0 < dv; j0++) dn_strip<1>(S, S_work, rows, T, n_src, dk, dv, j0);
}

}  // namespace
}  // namespace strata
