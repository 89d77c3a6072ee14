// Scalar twin of the attention kernel (attend.h) and the dispatch: per row and head, dot16 scores
// (16 lanes, fixed tree), softmax after subtracting the maximum, o accumulated over cells in order.
#include "kernels/attend.h"

#include <atomic>
#include <cmath>

#include "kernels/matmul.h"
#include "kernels/rowops.h"
#include "model/ops.h"
#include "util/common.h"

namespace strata {

void attend_ref(const AttendArgs& a, float* sc) {
  auto cell = [&](int64_t c) { return a.cells ? (int64_t)a.cells[c] : c; };
  for (int t = 0; t < a.T; t++)
    for (int h = 0; h < a.nh; h++) {
      const float* q = a.q + t * a.ldq_t + h * a.ldq_h;
      const int64_t n = a.n + t;
      float mx = -INFINITY;
      for (int64_t c = 0; c < n; c++) {
        sc[c] = dot16(q, a.k + cell(c) * a.ldkv, a.hd) * a.scale;
        mx = sc[c] > mx ? sc[c] : mx;
      }
      float sum = 0.f;
      exp_shift(sc, mx, n);
      for (int64_t c = 0; c < n; c++) sum += sc[c];
      const float inv = 1.f / sum;
      float* o = a.o + t * a.ldo_t + h * a.ldo_h;
      for (int64_t d = 0; d < a.hd; d++) o[d] = 0.f;
      for (int64_t c = 0; c < n; c++) {
        const float p = sc[c] * inv;
        const float* v = a.v + cell(c) * a.ldkv;
        for (int64_t d = 0; d < a.hd; d++) o[d] += p * v[d];
      }
    }
}

void attend_on(int isa, const AttendArgs& a, float* scratch, bool one_query) {
  STRATA_CHECK(!a.cells || a.T == 1, "attend: a cell list needs T = 1, got T = ", a.T);
  switch ((Isa)isa) {
    case Isa::AVX512: return attend_avx512(a, scratch, one_query);
    case Isa::AVX2: return attend_avx2(a, scratch, one_query);
    default: return attend_ref(a, scratch);
  }
}

namespace {
std::atomic<bool> g_one_query{false};
}

void attend_set_one_query(bool on) { g_one_query.store(on, std::memory_order_relaxed); }

void attend(const AttendArgs& a, float* scratch) {
  attend_on((int)active_isa(), a, scratch, g_one_query.load(std::memory_order_relaxed));
}

}  // namespace strata
