// dn_rows with AVX-512: the fused strip form (kernels/cpu/dn_fused_impl.h) over 64-column strips
// (4 zmm: m, o and the next row's m stay in registers). Same bits as the generic source.
#include <immintrin.h>

#include "kernels/cpu/dn_fused_impl.h"

namespace strata {

namespace {
struct V512 {
  using reg = __m512;
  static constexpr int kW = 16;
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg zero() { return _mm512_setzero_ps(); }
};
}  // namespace

void dn_rows_avx512(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) {
  DnFused<V512, 4>::rows(S, S_work, rows, T, n_src, dk, dv);
}

}  // namespace strata
