// The layers' elementwise and per-row operations on the card (ops_cuda.h, backend.h): each the CPU model's
// operations (ops.h, rowops_impl.h, deltanet.cpp, attention.cpp, moe.cpp) as correctly rounded float32 steps in
// the same order (__fadd_rn / __fmul_rn / __fdiv_rn, the build's --fmad=false besides), with rowops' exp_inl and
// glibc's expf / log1pf where the CPU calls them (exp_inl.cuh, libm_inl.cuh). Sums over a row keep dot16's 16
// lanes and tree (one warp per row, lanes 0..15 hold the lanes) or the CPU's running order (one thread).
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>

#include "backend/backend.h"
#include "kernels/cuda/exp_inl.cuh"
#include "kernels/cuda/lanes16.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/libm_inl.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

void launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the ", what, " kernel: ", cudaGetErrorString(e));
}
unsigned blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }


__global__ void k_add(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  pdl_wait();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

// rowops causal_conv_silu of channel c for row t: o = 0, o = o + w[j] * h(t + j) for j = 0..K-1, then silu (h(i):
// hist row i's channel c). k_conv_silu's and k_dn_conv_gates'.
template <class H>
__device__ __forceinline__ float conv_silu_at(const float* __restrict__ w_t, int64_t ld, int64_t c, int K, int t, H h) {
  float o = 0.f;
  for (int j = 0; j < K; j++) o = __fadd_rn(o, __fmul_rn(w_t[(int64_t)j * ld + c], h(t + j)));
  return silu_of(o);
}
// deltanet.cpp's l2norm scale of a q or k head of dk values (one warp): 1 / sqrt(dot16 + 1e-6).
__device__ __forceinline__ float l2_scale_warp(const float* v, int64_t dk) {
  return __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(dot16_warp(v, v, dk), 1e-6f)));
}
// deltanet.cpp's gates of value head h from its b and a: beta = sigmoid(b), eg = exp(ssm_a * softplus(a + dt_bias)).
__device__ __forceinline__ void dn_gate(float b, float a, float ssm_a, float dt_bias, float& beta, float& eg) {
  beta = sigmoid_libm(b);
  eg = expf_glibc(__fmul_rn(ssm_a, softplus_libm(__fadd_rn(a, dt_bias))));
}

// rowops causal_conv_silu over T rows (conv_silu_at).
__global__ void k_conv_silu(const float* __restrict__ hist, const float* __restrict__ w_t, int T, int64_t n, int64_t ld,
                            int K, float* __restrict__ out) {
  pdl_wait();
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  if (c >= n) return;
  out[(int64_t)t * ld + c] = conv_silu_at(w_t, ld, c, K, t, [&](int i) { return hist[(int64_t)i * ld + c]; });
}

// deltanet.cpp's per-row gates of key head g = blockIdx.x, row t = blockIdx.y (one warp).
__global__ void k_dn_gates(float* __restrict__ conv, int64_t ld, const float* __restrict__ ba,
                           const float* __restrict__ ssm_a, const float* __restrict__ dt_bias, int64_t nk, int64_t nv,
                           int64_t dk, float qscale, float* __restrict__ eg, float* __restrict__ beta) {
  pdl_wait();
  const int64_t g = blockIdx.x, r = nv / nk, key_dim = nk * dk;
  const int t = blockIdx.y, lane = threadIdx.x;
  float* row = conv + (int64_t)t * ld;
  float* q = row + g * dk;
  float* k = row + key_dim + g * dk;
  const float rq = l2_scale_warp(q, dk), rk = l2_scale_warp(k, dk);
  __syncwarp();
  for (int64_t i = lane; i < dk; i += 32) {
    q[i] = __fmul_rn(__fmul_rn(q[i], rq), qscale);
    k[i] = __fmul_rn(k[i], rk);
  }
  for (int64_t j = lane; j < r; j += 32) {
    const int64_t h = g * r + j;
    dn_gate(ba[(int64_t)t * 2 * nv + g * 2 * r + j], ba[(int64_t)t * 2 * nv + g * 2 * r + r + j], ssm_a[h], dt_bias[h],
            beta[t * nv + h], eg[t * nv + h]);
  }
}

// backend.h dn_conv_gates in one kernel (windows of T <= kDnConvMaxT rows): k_conv_silu's and k_dn_gates' operations
// in their order, hist's rows read where they lie (state row j < K - 1, else raw row j - (K - 1)), so no copies.
// Block b < nk nc: key head g = b % nk, its 2 dk channels (q at g dk, k at key_dim + g dk) over rows [c rb, c rb + rb)
// of chunk c = b / nk (nc = ceil(T / rb) chunks), a thread per (row, channel) (strided), into shared memory [rb][2 dk];
// then a warp per (row, q or k) forms the norm's 1 / sqrt(dot16 + 1e-6) (dot16_warp over the staged values: the same
// sum), the block scales and writes the rows, and the gates of value heads g r + j for those rows. Blocks from nk nc:
// kDnConvThreads / T v channels each, a thread per (row, channel). In place, a channel's new state rows (state row j
// = hist row T + j) are written after a __syncthreads, once every row that reads the old ones has: the v blocks hold
// all T rows of their channels; the key chunks are then rb = max(K - 1, 1) rows, so that only rows t < K - 1 (chunk 0)
// read the old state, and chunk 0 writes it. A window to verify (not in place) writes no state: a row a chunk.
// (A thread per channel over all T rows took 4.6 -> 15.4 us from T = 1 to 16 on the default model; all T rows of a
// key head a block, 18.2 us at T = 16: H100 profile, docs/BENCHMARKS.md session 33.)
constexpr int kDnConvMaxT = 16;
__host__ __device__ __forceinline__ int dn_key_rows(const DnConv& a) {
  return a.in_place ? (a.K > 2 ? a.K - 1 : 1) : 1;
}
constexpr int kDnConvThreads = 256;
__device__ __forceinline__ float dn_hist(const DnConv& a, int64_t c, int j) {
  return j < a.K - 1 ? a.state[(int64_t)j * a.cd + c] : a.raw[(int64_t)(j - (a.K - 1)) * a.cd + c];
}
// channel c's conv + SiLU of row t; not in place, raw's replay copy of that row and channel
__device__ __forceinline__ float dn_conv_at(const DnConv& a, int64_t c, int t) {
  if (!a.in_place) a.raw_rows[(int64_t)t * a.cd + c] = a.raw[(int64_t)t * a.cd + c];
  return conv_silu_at(a.w_t, a.cd, c, a.K, t, [&](int i) { return dn_hist(a, c, i); });
}
// in place: channel c's new state rows (after every row of c has been read: a __syncthreads before)
__device__ __forceinline__ void dn_conv_state(const DnConv& a, int64_t c) {
  if (a.in_place)
    for (int j = 0; j < a.K - 1; j++) a.state[(int64_t)j * a.cd + c] = dn_hist(a, c, a.T + j);
}
__global__ void __launch_bounds__(kDnConvThreads) k_dn_conv_gates(const __grid_constant__ DnConv a, float qscale) {
  pdl_wait();
  extern __shared__ float xs[];  // key head blocks: [rb][2 dk]
  __shared__ float rr[2 * kDnConvMaxT];
  const int64_t key_dim = a.nk * a.dk, T = a.T;
  const int rb = dn_key_rows(a), nc = (a.T + rb - 1) / rb;
  const int64_t key_blocks = a.nk * nc;
  if (blockIdx.x >= key_blocks) {  // v channels: kv a block, thread = t kv + channel
    const int64_t kv = kDnConvThreads / T, ci = threadIdx.x % kv;
    const int t = (int)(threadIdx.x / kv);
    const int64_t c = 2 * key_dim + (int64_t)(blockIdx.x - key_blocks) * kv + ci;
    if (t < T && c < a.cd) {
      const float o = dn_conv_at(a, c, t);
      a.out[t * a.cd + c] = o;
      if (!a.in_place) a.conv_rows[t * a.cd + c] = o;
    }
    __syncthreads();
    if (t == 0 && c < a.cd) dn_conv_state(a, c);
    return;
  }
  const int64_t g = blockIdx.x % a.nk, w = 2 * a.dk;
  const int t0 = (int)(blockIdx.x / a.nk) * rb, nt = min(rb, a.T - t0);  // rows t0 .. t0 + nt - 1
  auto chan = [&](int64_t i) { return i < a.dk ? g * a.dk + i : key_dim + g * a.dk + (i - a.dk); };
  for (int64_t p = threadIdx.x; p < w * nt; p += blockDim.x) {  // p = (t - t0) w + i
    const int64_t i = p % w;
    xs[p] = dn_conv_at(a, chan(i), t0 + (int)(p / w));
  }
  __syncthreads();
  if (t0 == 0)
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) dn_conv_state(a, chan(i));
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int p = warp; p < 2 * nt; p += nw) {  // p = 2 (t - t0) + (0: q, 1: k)
    const float* v = xs + (p >> 1) * w + (p & 1) * a.dk;
    const float s = l2_scale_warp(v, a.dk);
    if ((threadIdx.x & 31) == 0) rr[p] = s;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {
    const int64_t c = chan(i);
    for (int u = 0; u < nt; u++) {
      const int64_t t = t0 + u;
      const float x = xs[u * w + i];
      const float y = i < a.dk ? __fmul_rn(__fmul_rn(x, rr[2 * u]), qscale) : __fmul_rn(x, rr[2 * u + 1]);
      a.out[t * a.cd + c] = y;
      if (!a.in_place) a.conv_rows[t * a.cd + c] = y;
    }
  }
  const int64_t r = a.nv / a.nk;
  for (int64_t q = threadIdx.x; q < r * nt; q += blockDim.x) {  // (row t, value head g r + j)
    const int64_t t = t0 + q / r, j = q % r, h = g * r + j;
    float be, e;
    dn_gate(a.ba[t * 2 * a.nv + g * 2 * r + j], a.ba[t * 2 * a.nv + g * 2 * r + r + j], a.ssm_a[h], a.dt_bias[h], be, e);
    a.beta[t * a.nv + h] = be;
    a.eg[t * a.nv + h] = e;
    if (!a.in_place) {
      a.beta_rows[t * a.nv + h] = be;
      a.eg_rows[t * a.nv + h] = e;
    }
  }
}

// Qwen3.5's tiled value heads to the grouped order: one thread per (row, float of raw) and per head index.
__global__ void k_dn_untile(const float* __restrict__ rawf, float* __restrict__ raw, int64_t cd, int64_t key_dim,
                            const float* __restrict__ fz, float* __restrict__ z, const float* __restrict__ fb,
                            const float* __restrict__ fa, float* __restrict__ ba, const int32_t* __restrict__ fh,
                            int64_t nk, int64_t nv, int64_t dv) {
  pdl_wait();
  const int t = blockIdx.y;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, d_inner = nv * dv, r = nv / nk;
  if (i < cd) {
    int64_t src = i;
    if (i >= 2 * key_dim) {
      const int64_t j = (i - 2 * key_dim) / dv;
      src = 2 * key_dim + fh[j] * dv + (i - 2 * key_dim) % dv;
    }
    raw[(int64_t)t * cd + i] = rawf[(int64_t)t * cd + src];
  }
  if (i < d_inner) z[(int64_t)t * d_inner + i] = fz[(int64_t)t * d_inner + fh[i / dv] * dv + i % dv];
  if (i < nv) {
    ba[(int64_t)t * 2 * nv + (i / r) * 2 * r + i % r] = fb[(int64_t)t * nv + fh[i]];
    ba[(int64_t)t * 2 * nv + (i / r) * 2 * r + r + i % r] = fa[(int64_t)t * nv + fh[i]];
  }
}
__global__ void k_dn_retile(const float* __restrict__ y, float* __restrict__ out, const int32_t* __restrict__ fh,
                            int64_t nv, int64_t dv) {
  pdl_wait();
  const int t = blockIdx.y;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, d_inner = nv * dv;
  if (i < d_inner) out[(int64_t)t * d_inner + fh[i / dv] * dv + i % dv] = y[(int64_t)t * d_inner + i];
}

// rmsnorm(x; w) of one row of n per warp, then y *= silu(z) or sigmoid(z) (rowops mul_silu / mul_sigmoid).
__global__ void k_gated_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ z,
                             int64_t n, float eps, bool sig, float* __restrict__ y) {
  pdl_wait();
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  const float r = rms_scale_warp(xr, n, eps);
  for (int64_t i = threadIdx.x; i < n; i += 32) y[row * n + i] = gated_value(xr[i], r, w[i], z[row * n + i], sig);
}

__global__ void k_mul_sigmoid_rows(float* __restrict__ o, int64_t ldo, const float* __restrict__ g, int64_t ldg,
                                   int64_t n) {
  pdl_wait();
  const int64_t row = blockIdx.y, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) o[row * ldo + i] = __fmul_rn(o[row * ldo + i], sigmoid_of(g[row * ldg + i]));
}

__global__ void k_silu_mul(float* __restrict__ g, const float* __restrict__ u, int64_t n) {
  pdl_wait();
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g[i] = __fmul_rn(silu_of(g[i]), u[i]);
}

// attention.cpp: rmsnorm of one head in place, then rope_neox of its first n_rot dims. One warp per (t, head).
__global__ void k_norm_rope(float* x, int64_t ldt, int64_t ldh, int nh, const float* __restrict__ w, int64_t hd,
                            float eps, const float* __restrict__ cs, const float* __restrict__ sn, int64_t n_rot,
                            int64_t pos0, const int32_t* __restrict__ pos) {
  pdl_wait();
  if (pos) pos0 = *pos;  // a recorded step: the position from device memory
  const int t = blockIdx.x / nh, h = blockIdx.x % nh;
  float* v = x + t * ldt + h * ldh;
  const float r = rms_scale_warp(v, hd, eps);
  __syncwarp();
  for (int64_t i = threadIdx.x; i < hd; i += 32) v[i] = __fmul_rn(__fmul_rn(v[i], r), w[i]);
  __syncwarp();
  const int64_t half = n_rot / 2;
  const float* c = cs + (pos0 + t) * half;
  const float* s = sn + (pos0 + t) * half;
  for (int64_t i = threadIdx.x; i < half; i += 32) {
    const float a = v[i], b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, c[i]), __fmul_rn(b, s[i]));
    v[i + half] = __fadd_rn(__fmul_rn(b, c[i]), __fmul_rn(a, s[i]));
  }
}

// Rows of k and v into the cache at the position read from device memory (recorded steps).
__global__ void k_kv_store(const float* __restrict__ k, const float* __restrict__ v, int64_t width,
                           float* __restrict__ kc, float* __restrict__ vc, const int32_t* __restrict__ pos) {
  pdl_wait();
  const int t = blockIdx.y;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= width) return;
  const int64_t c = (int64_t)*pos + t;
  kc[c * width + i] = k[(int64_t)t * width + i];
  vc[c * width + i] = v[(int64_t)t * width + i];
}

// moe.cpp's shared-expert gate of row t = blockIdx.x: gl = the running sum of gate[i] * x[t][i] (one thread adds, in
// order, the products the warp computed into shared memory), then sigmoid (libm exp).
__global__ void k_shared_gate(const float* __restrict__ gate, const float* __restrict__ x, int64_t H,
                              float* __restrict__ sg) {
  pdl_wait();
  __shared__ float prod[1024];
  const float* xt = x + (int64_t)blockIdx.x * H;
  float gl = 0.f;
  for (int64_t i0 = 0; i0 < H; i0 += 1024) {
    const int64_t n = H - i0 < 1024 ? H - i0 : 1024;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) prod[i] = __fmul_rn(gate[i0 + i], xt[i0 + i]);
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll 16
      for (int i = 0; i < (int)n; i++) gl = __fadd_rn(gl, prod[i]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) sg[blockIdx.x] = sigmoid_libm(gl);
}

// moe.cpp's combine: o = 0, o = o + wt_j * y_j for j = 0..k-1 (axpy: a multiply, then an add), then o + sg * sh.
__global__ void k_moe_combine(const float* __restrict__ yg, const float* __restrict__ wt, int k, int64_t H,
                              const float* __restrict__ sh, const float* __restrict__ sg, float* __restrict__ out) {
  pdl_wait();
  const int t = blockIdx.y;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= H) return;
  float o = 0.f;
  for (int j = 0; j < k; j++) o = __fadd_rn(o, __fmul_rn(wt[t * k + j], yg[((int64_t)t * k + j) * H + i]));
  if (sh) o = __fadd_rn(o, __fmul_rn(sg[t], sh[(int64_t)t * H + i]));
  out[(int64_t)t * H + i] = o;
}

}  // namespace

void add(float* x, const float* y, int64_t n, void* stream) {
  if (n <= 0) return;
  launch(k_add, blocks(n, 256), 256, 0, static_cast<cudaStream_t>(stream), x, y, n);
  launched("add");
}

void conv_silu(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out, void* stream) {
  STRATA_CHECK(T >= 1 && n >= 1 && K >= 1, "cuda conv_silu: T = ", T, ", n = ", n, ", K = ", K);
  launch(k_conv_silu, dim3(blocks(n, 128), (unsigned)T), 128, 0, static_cast<cudaStream_t>(stream), hist, w_t, T, n, ld,
         K, out);
  launched("conv_silu");
}

void dn_gates(float* conv, int64_t ld, const float* ba, const float* ssm_a, const float* dt_bias, int T, int64_t nk,
              int64_t nv, int64_t dk, float qscale, float* eg, float* beta, void* stream) {
  STRATA_CHECK(T >= 1 && nk >= 1 && nv % nk == 0, "cuda dn_gates: T = ", T, ", nk = ", nk, ", nv = ", nv);
  launch(k_dn_gates, dim3((unsigned)nk, (unsigned)T), 32, 0, static_cast<cudaStream_t>(stream), conv, ld, ba, ssm_a,
         dt_bias, nk, nv, dk, qscale, eg, beta);
  launched("dn_gates");
}

bool dn_conv_gates(const DnConv& a, float qscale, void* stream) {
  if (a.T < 1 || a.T > kDnConvMaxT || a.K < 1 || a.nk < 1 || a.nv % a.nk != 0 || a.cd < 2 * a.nk * a.dk) return false;
  const int rb = std::min(dn_key_rows(a), a.T), nc = (a.T + rb - 1) / rb;
  const size_t smem = (size_t)rb * 2 * a.dk * sizeof(float);
  if (smem > 48 * 1024) return false;
  const unsigned nvb = blocks(a.cd - 2 * a.nk * a.dk, kDnConvThreads / a.T);
  launch(k_dn_conv_gates, (unsigned)(a.nk * nc) + nvb, kDnConvThreads, smem, static_cast<cudaStream_t>(stream), a,
         qscale);
  launched("dn_conv_gates");
  return true;
}

void dn_untile(const float* rawf, float* raw, int64_t cd, int64_t key_dim, const float* fz, float* z, const float* fb,
               const float* fa, float* ba, const int32_t* fh, int T, int64_t nk, int64_t nv, int64_t dv, void* stream) {
  launch(k_dn_untile, dim3(blocks(cd, 256), (unsigned)T), 256, 0, static_cast<cudaStream_t>(stream), rawf, raw, cd,
         key_dim, fz, z, fb, fa, ba, fh, nk, nv, dv);
  launched("dn_untile");
}

void dn_retile(const float* y, float* out, const int32_t* fh, int T, int64_t nv, int64_t dv, void* stream) {
  launch(k_dn_retile, dim3(blocks(nv * dv, 256), (unsigned)T), 256, 0, static_cast<cudaStream_t>(stream), y, out, fh,
         nv, dv);
  launched("dn_retile");
}

void gated_norm(const float* x, const float* w, const float* z, int64_t n, int rows, float eps, bool sig, float* y,
                void* stream) {
  if (rows <= 0) return;
  launch(k_gated_norm, (unsigned)rows, 32, 0, static_cast<cudaStream_t>(stream), x, w, z, n, eps, sig, y);
  launched("gated_norm");
}

void mul_sigmoid_rows(float* o, int64_t ldo, const float* g, int64_t ldg, int64_t n, int rows, void* stream) {
  if (rows <= 0) return;
  launch(k_mul_sigmoid_rows, dim3(blocks(n, 128), (unsigned)rows), 128, 0, static_cast<cudaStream_t>(stream), o, ldo, g,
         ldg, n);
  launched("mul_sigmoid_rows");
}

void silu_mul(float* g, const float* u, int64_t n, void* stream) {
  if (n <= 0) return;
  launch(k_silu_mul, blocks(n, 256), 256, 0, static_cast<cudaStream_t>(stream), g, u, n);
  launched("silu_mul");
}

void norm_rope(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps, const float* cs,
               const float* sn, int64_t n_rot, int64_t pos0, void* stream) {
  STRATA_CHECK(T >= 1 && nh >= 1 && n_rot <= hd, "cuda norm_rope: T = ", T, ", nh = ", nh, ", n_rot = ", n_rot);
  launch(k_norm_rope, (unsigned)(T * nh), 32, 0, static_cast<cudaStream_t>(stream), x, ldt, ldh, nh, w, hd, eps, cs, sn,
         n_rot, pos0, nullptr);
  launched("norm_rope");
}

void norm_rope_at(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps,
                  const float* cs, const float* sn, int64_t n_rot, const int32_t* pos, void* stream) {
  STRATA_CHECK(T >= 1 && nh >= 1 && n_rot <= hd && pos, "cuda norm_rope_at: T = ", T, ", nh = ", nh, ", n_rot = ", n_rot);
  launch(k_norm_rope, (unsigned)(T * nh), 32, 0, static_cast<cudaStream_t>(stream), x, ldt, ldh, nh, w, hd, eps, cs, sn,
         n_rot, 0, pos);
  launched("norm_rope");
}

void kv_store(const float* k, const float* v, int T, int64_t width, float* kc, float* vc, const int32_t* pos,
              void* stream) {
  STRATA_CHECK(T >= 1 && width >= 1 && pos, "cuda kv_store: T = ", T, ", width = ", width);
  launch(k_kv_store, dim3(blocks(width, 256), (unsigned)T), 256, 0, static_cast<cudaStream_t>(stream), k, v, width, kc,
         vc, pos);
  launched("kv_store");
}

void moe_combine(const float* yg, const float* wt, int T, int k, int64_t H, const float* sh, const float* gate_shexp,
                 const float* x, float* out, float* sg, void* stream, bool gate_ready) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (sh && !gate_ready) {
    launch(k_shared_gate, (unsigned)T, 256, 0, st, gate_shexp, x, H, sg);
    launched("shared_gate");
  }
  launch(k_moe_combine, dim3(blocks(H, 256), (unsigned)T), 256, 0, st, yg, wt, k, H, sh, sg, out);
  launched("moe_combine");
}

void shared_gate(const float* gate_shexp, const float* x, int T, int64_t H, float* sg, void* stream) {
  launch(k_shared_gate, (unsigned)T, 256, 0, static_cast<cudaStream_t>(stream), gate_shexp, x, H, sg);
  launched("shared_gate");
}

}  // namespace strata::cuda
