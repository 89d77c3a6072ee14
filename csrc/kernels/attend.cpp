// Scalar twin of the attention kernel (attend.h) and the dispatch. dot16 sums in 16 lanes with a fixed
// tree; softmax subtracts the maximum; the output accumulates p * v over cells in increasing order.
#include "kernels/attend.h"
#include "kernels/rowops.h"

#include <cmath>

#include "kernels/matmul.h"
#include "model/ops.h"

namespace strata {

void attend_ref(const AttendArgs& a, float* sc) {
  for (int h = 0; h < a.nq; h++) {
    const float* q = a.q + h * a.ldq;
    float mx = -INFINITY;
    for (int64_t c = 0; c < a.n; c++) {
      sc[c] = dot16(q, a.k + c * a.ldkv, a.hd) * a.scale;
      mx = sc[c] > mx ? sc[c] : mx;
    }
    float sum = 0.f;
    exp_shift(sc, mx, a.n);
    for (int64_t c = 0; c < a.n; c++) sum += sc[c];
    const float inv = 1.f / sum;
    float* o = a.o + h * a.ldo;
    for (int64_t d = 0; d < a.hd; d++) o[d] = 0.f;
    for (int64_t c = 0; c < a.n; c++) {
      const float p = sc[c] * inv;
      const float* v = a.v + c * a.ldkv;
      for (int64_t d = 0; d < a.hd; d++) o[d] += p * v[d];
    }
  }
}

void attend(const AttendArgs& a, float* scratch) {
  if (active_isa() == Isa::AVX512) attend_avx512(a, scratch);
  else attend_ref(a, scratch);
}

}  // namespace strata
