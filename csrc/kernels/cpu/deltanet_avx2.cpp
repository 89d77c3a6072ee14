// dn_rows with AVX2: the fused strip form (kernels/cpu/dn_fused_impl.h) over 32-column strips (4 ymm: m, o
// and the next row's m take 12 of the 16 registers). Same bits as the generic source.
#include <immintrin.h>

#include "kernels/cpu/dn_fused_impl.h"

namespace strata {

namespace {
struct V256 {
  using reg = __m256;
  static constexpr int kW = 8;
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg zero() { return _mm256_setzero_ps(); }
};
}  // namespace

void dn_rows_avx2(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) {
  DnFused<V256, 4>::rows(S, S_work, rows, T, n_src, dk, dv);
}

}  // namespace strata
