// Attention on the card (ops_cuda.h attend): attend_ref's float32 operations in attend_ref's order, so the result
// equals it bit for bit. One thread block per (row t, head h):
//   1. scores: 16-thread groups take cells in turn; lane i of a group sums q[i'] * k[i'] over i' = i (mod 16) in
//      increasing i' (dot16's lanes, tail included), then dot16's tree by shuffles; times scale. The maximum is
//      order-free (NaN never wins a comparison, and a +0 / -0 tie changes no x - mx).
//   2. exp_shift: sc[c] = exp_inl(sc[c] - mx), rowops' polynomial ported to the device (exp_inl.cuh).
//   3. sum: one running float sum in increasing c (attend_ref's order: one thread, the price of bit identity).
//   4. o[d] = sum over c in increasing c of (sc[c] * inv) * v[c][d]: a thread per d, cells staged in shared memory.
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>

#include "kernels/cuda/exp_inl.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float max_nan_loses(float m, float x) { return x > m ? x : m; }

__global__ void __launch_bounds__(kThreads) k_attend(AttendArgs a, float* __restrict__ scratch, int64_t stride) {
  const int t = blockIdx.x / a.nh, h = blockIdx.x % a.nh, tid = threadIdx.x;
  const float* q = a.q + t * a.ldq_t + h * a.ldq_h;
  const int64_t n = a.n + t;
  float* sc = scratch + (int64_t)blockIdx.x * stride;
  __shared__ float red[kThreads / 32];
  __shared__ float p_s[kThreads];
  __shared__ int64_t cell_s[kThreads];
  __shared__ float bcast;

  // 1. scores and their maximum
  const int g = tid >> 4, lane = tid & 15;
  float mx = -INFINITY;
  for (int64_t c0 = 0; c0 < n; c0 += kThreads / 16) {  // the same trip count for every thread (shuffles)
    const int64_t c = c0 + g;
    const bool in = c < n;
    float l = 0.f;
    if (in) {
      const float* key = a.k + (a.cells ? (int64_t)a.cells[c] : c) * a.ldkv;
      for (int64_t i = lane; i < a.hd; i += 16) l = __fadd_rn(l, __fmul_rn(__ldg(q + i), __ldg(key + i)));
    }
    l = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 8, 16));
    l = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 4, 16));
    l = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 2, 16));
    l = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 1, 16));
    if (in && lane == 0) {
      const float s = __fmul_rn(l, a.scale);
      sc[c] = s;
      mx = max_nan_loses(mx, s);
    }
  }
  for (int o = 16; o; o >>= 1) mx = max_nan_loses(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((tid & 31) == 0) red[tid >> 5] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < kThreads / 32; w++) mx = max_nan_loses(mx, red[w]);

  // 2. exp_shift
  for (int64_t c = tid; c < n; c += kThreads) sc[c] = exp_inl_dev(__fsub_rn(sc[c], mx));
  __syncthreads();
  // 3. the running sum, in cell order
  if (tid == 0) {
    float sum = 0.f;
    for (int64_t c = 0; c < n; c++) sum = __fadd_rn(sum, sc[c]);
    bcast = __fdiv_rn(1.f, sum);
  }
  __syncthreads();
  const float inv = bcast;

  // 4. o accumulated over cells in order
  float* o = a.o + t * a.ldo_t + h * a.ldo_h;
  for (int64_t d0 = 0; d0 < a.hd; d0 += kThreads) {
    const int64_t d = d0 + tid;
    float acc = 0.f;
    for (int64_t c0 = 0; c0 < n; c0 += kThreads) {
      __syncthreads();
      if (c0 + tid < n) {
        p_s[tid] = __fmul_rn(sc[c0 + tid], inv);
        cell_s[tid] = (a.cells ? (int64_t)a.cells[c0 + tid] : c0 + tid) * a.ldkv;
      }
      __syncthreads();
      const int m = n - c0 < kThreads ? (int)(n - c0) : kThreads;
      if (d < a.hd)
        for (int i = 0; i < m; i++) acc = __fadd_rn(acc, __fmul_rn(p_s[i], __ldg(a.v + cell_s[i] + d)));
    }
    if (d < a.hd) o[d] = acc;
  }
}

}  // namespace

void attend(const AttendArgs& a, float* scratch, void* stream) {
  STRATA_CHECK(!a.cells || a.T == 1, "attend: a cell list needs T = 1, got T = ", a.T);
  STRATA_CHECK(a.T >= 1 && a.nh >= 1 && a.hd >= 1 && a.n >= 0, "attend: T = ", a.T, ", nh = ", a.nh, ", hd = ", a.hd,
               ", n = ", a.n);
  const int64_t stride = a.n + a.T;  // row t, head h uses n + t <= stride floats (attend_scratch has more)
  k_attend<<<(unsigned)(a.T * a.nh), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, scratch, stride);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the attention kernel: ", cudaGetErrorString(e));
}

}  // namespace strata::cuda
