// Attention on the card (ops_cuda.h attend): attend_ref's float32 operations in attend_ref's order, so the result
// equals it bit for bit. Two kernels:
//   1. k_scores (row x head, blocks of 256 cells): a 16-thread group per cell; lane i sums q[i'] * k[i'] over
//      i' = i (mod 16) in increasing i' (dot16's lanes, tail included), then dot16's tree by shuffles; times scale.
//   k_softmax_v (a block per (row, head)):
//   2. the maximum: order-free (NaN never wins a comparison, and a +0 / -0 tie changes no x - mx);
//      exp_shift: sc[c] = exp_inl(sc[c] - mx), rowops' polynomial ported to the device (exp_inl.cuh).
//   3. sum: one running float sum in increasing c (attend_ref's order: one thread, the price of bit identity).
//   4. o[d] = sum over c in increasing c of (sc[c] * inv) * v[c][d]: a thread per d, cells staged in shared memory.
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>

#include "kernels/cuda/exp_inl.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 32;  // V loads issued together in the output loop
constexpr int kCellsPerScoreBlock = 256;  // 16 groups of 16 lanes, 16 cells each
constexpr int kStage = 4 * kThreads;      // cells staged in shared memory for the running sum

__device__ __forceinline__ float max_nan_loses(float m, float x) { return x > m ? x : m; }

// 1. scores: sc[c] = dot16(q, k[cell c]) * scale for the cells of row t; a 2-D grid (row x head, cell blocks) so
// that long contexts spread over the whole card.
__global__ void __launch_bounds__(kThreads) k_scores(AttendArgs a, float* __restrict__ scratch, int64_t stride,
                                                     const int32_t* __restrict__ n_dev) {
  pdl_wait();
  const int t = blockIdx.x / a.nh, h = blockIdx.x % a.nh, tid = threadIdx.x;
  const float* q = a.q + t * a.ldq_t + h * a.ldq_h;
  const int64_t n = (n_dev ? (int64_t)*n_dev : a.n) + t;
  float* sc = scratch + (int64_t)blockIdx.x * stride;
  const int g = tid >> 4, lane = tid & 15;
  const int64_t c_base = (int64_t)blockIdx.y * kCellsPerScoreBlock;
  if (c_base >= n) return;  // the whole block: no shuffle partner is left behind
#pragma unroll 4
  for (int j = 0; j < kCellsPerScoreBlock / 16; j++) {
    const int64_t c = c_base + j * 16 + g;
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
    if (in && lane == 0) sc[c] = __fmul_rn(l, a.scale);
  }
}

// 2-4. the maximum, exp_shift with the running sum, then o; a block per (row, head).
__global__ void __launch_bounds__(kThreads) k_softmax_v(AttendArgs a, float* __restrict__ scratch, int64_t stride,
                                                        const int32_t* __restrict__ n_dev) {
  pdl_wait();
  const int t = blockIdx.x / a.nh, h = blockIdx.x % a.nh, tid = threadIdx.x;
  const int64_t n = (n_dev ? (int64_t)*n_dev : a.n) + t;
  float* sc = scratch + (int64_t)blockIdx.x * stride;
  __shared__ float red[kThreads / 32];
  __shared__ float stage[kStage];
  __shared__ float p_s[kThreads];
  __shared__ int64_t cell_s[kThreads];
  __shared__ float bcast;

  float mx = -INFINITY;
  for (int64_t c = tid; c < n; c += kThreads) mx = max_nan_loses(mx, sc[c]);
  for (int o = 16; o; o >>= 1) mx = max_nan_loses(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((tid & 31) == 0) red[tid >> 5] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < kThreads / 32; w++) mx = max_nan_loses(mx, red[w]);

  // exp_shift, and attend_ref's running sum in cell order (thread 0, from shared memory, kStage cells at a time)
  float sum = 0.f;
  for (int64_t c0 = 0; c0 < n; c0 += kStage) {
    for (int i = tid; i < kStage; i += kThreads)
      if (c0 + i < n) {
        const float x = exp_inl_dev(__fsub_rn(sc[c0 + i], mx));
        sc[c0 + i] = x;
        stage[i] = x;
      }
    __syncthreads();
    if (tid == 0) {
      const int m = n - c0 < kStage ? (int)(n - c0) : kStage;
#pragma unroll 8
      for (int i = 0; i < m; i++) sum = __fadd_rn(sum, stage[i]);
    }
    __syncthreads();
  }
  if (tid == 0) bcast = __fdiv_rn(1.f, sum);
  __syncthreads();
  const float inv = bcast;

  // o accumulated over cells in order
  float* o = a.o + t * a.ldo_t + h * a.ldo_h;
  const float* __restrict__ vp = a.v;
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
        for (int i0 = 0; i0 < m; i0 += kBatch) {  // kBatch loads in flight, then the adds in cell order
          float vv[kBatch];
#pragma unroll
          for (int j = 0; j < kBatch; j++) vv[j] = vp[cell_s[i0 + j < m ? i0 + j : m - 1] + d];  // branch-free
          if (i0 + kBatch <= m) {
#pragma unroll
            for (int j = 0; j < kBatch; j++) acc = __fadd_rn(acc, __fmul_rn(p_s[i0 + j], vv[j]));
          } else {
#pragma unroll
            for (int j = 0; j < kBatch; j++)
              if (j < m - i0) acc = __fadd_rn(acc, __fmul_rn(p_s[i0 + j], vv[j]));
          }
        }
    }
    if (d < a.hd) o[d] = acc;
  }
}

}  // namespace

void attend(const AttendArgs& a, float* scratch, void* stream, const int32_t* n_dev) {
  STRATA_CHECK(!a.cells || a.T == 1, "attend: a cell list needs T = 1, got T = ", a.T);
  STRATA_CHECK(a.T >= 1 && a.nh >= 1 && a.hd >= 1 && a.n >= 0, "attend: T = ", a.T, ", nh = ", a.nh, ", hd = ", a.hd,
               ", n = ", a.n);
  const int64_t stride = a.n + a.T;  // row t, head h uses n + t <= stride floats (attend_scratch has more)
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int64_t cell_blocks = (a.n + a.T - 1 + kCellsPerScoreBlock - 1) / kCellsPerScoreBlock;
  if (cell_blocks > 0) {
    STRATA_CHECK(cell_blocks < 65536, "cuda attend: ", a.n, " cells are more than one launch covers");
    launch(k_scores, dim3((unsigned)(a.T * a.nh), (unsigned)cell_blocks), kThreads, 0, st, a, scratch, stride, n_dev);
  }
  launch(k_softmax_v, (unsigned)(a.T * a.nh), kThreads, 0, st, a, scratch, stride, n_dev);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the attention kernels: ", cudaGetErrorString(e));
}

}  // namespace strata::cuda
