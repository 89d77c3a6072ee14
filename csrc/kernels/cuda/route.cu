// MoE routing on the card (ops_cuda.h moe_route): the CPU backend's route_row per row, one thread block a row.
// p = exp_inl(l - max) (the maximum is order-free for non-NaN logits), one running float sum in expert order,
// p / sum; the top k by (p desc, id asc), found as k argmaxes in that order (a total order for non-NaN p: exact, no
// sort order to depend on); weights p / ws with ws a running sum over the k in rank order.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "kernels/cuda/exp_inl.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 512;

// J: the experts a lane of warp 0 holds in registers for the top k (E <= 32 J); more experts: the whole block.
template <int J>
__global__ void __launch_bounds__(kThreads) k_route(const float* __restrict__ logits, int64_t E, int k,
                                                    int32_t* __restrict__ sel, float* __restrict__ wt) {
  pdl_wait();
  extern __shared__ float p[];  // [E] floats, then [k] ints, then the selection bits
  int32_t* idx = reinterpret_cast<int32_t*>(p + E);
  __shared__ float red[kThreads / 32];
  __shared__ int32_t redi[kThreads / 32];
  uint32_t* taken = reinterpret_cast<uint32_t*>(idx + k);  // [ceil(E / 32)] selection bits
  __shared__ float bcast;
  const int t = blockIdx.x, tid = threadIdx.x;
  const float* l = logits + t * E;
  float mx = -INFINITY;  // std::max(mx, l[e]) order: (mx < x) ? x : mx
  for (int64_t e = tid; e < E; e += kThreads) mx = mx < l[e] ? l[e] : mx;
  for (int o = 16; o; o >>= 1) {
    const float x = __shfl_xor_sync(0xffffffffu, mx, o);
    mx = mx < x ? x : mx;
  }
  if ((tid & 31) == 0) red[tid >> 5] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < kThreads / 32; w++) mx = mx < red[w] ? red[w] : mx;
  for (int64_t e = tid; e < E; e += kThreads) p[e] = exp_inl_dev(__fsub_rn(l[e], mx));
  for (int64_t i = tid; i < (E + 31) / 32; i += kThreads) taken[i] = 0u;
  __syncthreads();
  if (tid == 0) {
    float sum = 0.f;
#pragma unroll 16
    for (int64_t e = 0; e < E; e++) sum = __fadd_rn(sum, p[e]);
    bcast = sum;
  }
  __syncthreads();
  const float sum = bcast;
  for (int64_t e = tid; e < E; e += kThreads) p[e] = __fdiv_rn(p[e], sum);
  __syncthreads();
  // the top k, one per round: the first of the unselected experts in the order (p desc, id asc), an argmax over
  // the experts (that order is total for non-NaN p, so the winner is the expert of rank j: the partial sort's).
  // E <= 32 J: warp 0 alone, lane l holding experts l + 32 jj in registers (NaN: none, or taken); each round the
  // lanes' bests meet by shuffles and only the winner's lane looks again. More experts: the whole block.
  if (E <= 32 * J) {
    if (tid < 32) {
      float v[J];
#pragma unroll
      for (int jj = 0; jj < J; jj++) v[jj] = tid + 32 * jj < E ? p[tid + 32 * jj] : __int_as_float(0x7fc00000);
      float lp = -INFINITY;  // the lane's best: the first of the largest in id order (ids rise with jj)
      int32_t li = INT32_MAX;
      auto look = [&] {
        lp = -INFINITY;
        li = INT32_MAX;
#pragma unroll
        for (int jj = 0; jj < J; jj++)
          if (v[jj] > lp) lp = v[jj], li = tid + 32 * jj;  // NaN never wins
      };
      look();
      for (int j = 0; j < k; j++) {
        float bp = lp;
        int32_t bi = li;
        for (int o = 16; o; o >>= 1) {
          const float op = __shfl_xor_sync(0xffffffffu, bp, o);
          const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
          if (op > bp || (op == bp && oi < bi)) bp = op, bi = oi;
        }
        if (bi == INT32_MAX) bi = 0;  // only NaN left: the CPU's order is undefined there
        if ((bi & 31) == tid) {
#pragma unroll
          for (int jj = 0; jj < J; jj++)
            if (jj == bi >> 5) v[jj] = __int_as_float(0x7fc00000);
          look();
        }
        if (tid == 0) idx[j] = bi;
      }
    }
    __syncthreads();
  } else {
    for (int j = 0; j < k; j++) {
      float bp = -INFINITY;
      int32_t bi = INT32_MAX;
      for (int64_t e = tid; e < E; e += kThreads) {
        const float pe = p[e];
        if (pe != pe || taken[e >> 5] >> (e & 31) & 1u) continue;
        if (pe > bp || (pe == bp && (int32_t)e < bi)) bp = pe, bi = (int32_t)e;
      }
      for (int o = 16; o; o >>= 1) {
        const float op = __shfl_xor_sync(0xffffffffu, bp, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (op > bp || (op == bp && oi < bi)) bp = op, bi = oi;
      }
      if ((tid & 31) == 0) red[tid >> 5] = bp, redi[tid >> 5] = bi;
      __syncthreads();
      if (tid == 0) {
        for (int w = 1; w < kThreads / 32; w++)
          if (red[w] > bp || (red[w] == bp && redi[w] < bi)) bp = red[w], bi = redi[w];
        if (bi == INT32_MAX) bi = 0;
        idx[j] = bi;
        taken[bi >> 5] |= 1u << (bi & 31);
      }
      __syncthreads();
    }
  }
  if (tid == 0) {
    float ws = 0.f;
    for (int j = 0; j < k; j++) ws = __fadd_rn(ws, p[idx[j]]);
    bcast = ws;
  }
  __syncthreads();
  for (int j = tid; j < k; j += kThreads) {
    sel[t * k + j] = idx[j];
    wt[t * k + j] = __fdiv_rn(p[idx[j]], bcast);
  }
}

}  // namespace

void moe_route(const float* logits, int T, int64_t E, int k, int32_t* sel, float* wt, void* stream) {
  STRATA_CHECK(k >= 1 && k <= E, "moe_route: k = ", k, " for ", E, " experts");
  STRATA_CHECK(T >= 1, "moe_route: T = ", T);
  const size_t smem = (size_t)E * 4 + (size_t)k * 4 + (size_t)(E + 31) / 32 * 4;
  STRATA_CHECK(smem <= 48 * 1024, "cuda moe_route: ", E, " experts do not fit the kernel's shared memory");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (E <= 32 * 16) launch(k_route<16>, (unsigned)T, kThreads, smem, st, logits, E, k, sel, wt);
  else launch(k_route<32>, (unsigned)T, kThreads, smem, st, logits, E, k, sel, wt);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the routing kernel: ", cudaGetErrorString(e));
}

}  // namespace strata::cuda
