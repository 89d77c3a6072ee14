// Elementwise activations over whole rows (SiLU, sigmoid gates, the DeltaNet causal conv), on the
// active ISA. All paths compile one source (rowops_impl.h) of float multiplies, adds and divides, no
// contraction and no reassociation, so they give the same bits on every ISA; exp is vexp below, not libm.
#pragma once
#include <cstdint>

namespace strata {

// x <- silu(x), silu(x) = x / (1 + exp(-x))
void silu_inplace(float* x, int64_t n);
// g <- silu(g) * u   (SwiGLU)
void silu_mul(float* g, const float* u, int64_t n);
// y <- y * silu(z)
void mul_silu(float* y, const float* z, int64_t n);
// o <- o * sigmoid(g)
void mul_sigmoid(float* o, const float* g, int64_t n);
// x <- exp(x - m); returns nothing (callers sum in their own order)
void exp_shift(float* x, float m, int64_t n);
// y <- y + a * x   (a multiply, then an add: never fused)
void axpy(float* y, const float* x, float a, int64_t n);
// Causal depthwise conv + SiLU over T rows for n channels: out[t][c] = silu(sum_j w_t[j][c] * hist[t + j][c]),
// j = 0..K-1 in increasing order from 0. hist is [K-1+T][ld], w_t the taps transposed to [K][ld], out [T][ld];
// columns c < n are computed (pass pointers offset to a channel range).
void causal_conv_silu(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out);

// exp(x) in float32: Cody-Waite reduction by ln 2 and Cephes' degree-6 polynomial (about 1 ulp), inputs
// clamped to [-87.3, 88] so 2^n stays a normal number; the scalar twin of what the loops inline.
float vexp(float x);

// The same functions per ISA (rowops.cpp: baseline; cpu/rowops_avx2.cpp, cpu/rowops_avx512.cpp).
struct RowOps {
  void (*silu_inplace)(float*, int64_t);  // x <- silu(x): the conv's activation (tested per build)
  void (*silu_mul)(float*, const float*, int64_t);
  void (*mul_silu)(float*, const float*, int64_t);
  void (*mul_sigmoid)(float*, const float*, int64_t);
  void (*exp_shift)(float*, float, int64_t);
  void (*axpy)(float*, const float*, float, int64_t);
  void (*causal_conv_silu)(const float*, const float*, int, int64_t, int64_t, int, float*);
};
const RowOps& rowops_base();
const RowOps& rowops_avx2();
const RowOps& rowops_avx512();
const RowOps& rowops_for(int isa);  // the build for an Isa value (matmul.h), for tests

}  // namespace strata
