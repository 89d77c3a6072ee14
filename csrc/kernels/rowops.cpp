// rowops.h on baseline x86-64, and the dispatch to the active ISA's build.
#include "kernels/rowops.h"

#include "kernels/matmul.h"
#include "kernels/rowops_impl.h"

namespace strata {

float vexp(float x) { return exp_inl(x); }

const RowOps& rowops_base() { return kRowOps; }

const RowOps& rowops_for(int isa) {
  switch ((Isa)isa) {
    case Isa::AVX512: return rowops_avx512();
    case Isa::AVX2: return rowops_avx2();
    default: return rowops_base();
  }
}

static const RowOps& ops() { return rowops_for((int)active_isa()); }

void silu_inplace(float* x, int64_t n) { ops().silu_inplace(x, n); }
void silu_mul(float* g, const float* u, int64_t n) { ops().silu_mul(g, u, n); }
void mul_silu(float* y, const float* z, int64_t n) { ops().mul_silu(y, z, n); }
void mul_sigmoid(float* o, const float* g, int64_t n) { ops().mul_sigmoid(o, g, n); }
void exp_shift(float* x, float m, int64_t n) { ops().exp_shift(x, m, n); }
void axpy(float* y, const float* x, float a, int64_t n) { ops().axpy(y, x, a, n); }
void causal_conv_silu(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out) {
  ops().causal_conv_silu(hist, w_t, T, n, ld, K, out);
}

}  // namespace strata
