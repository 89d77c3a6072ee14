// The window's token choice on the card (ops_cuda.h sample_rows): sampler.cpp's semantics step for step.
//   k_prepare (a block per row): the row copied, its penalties (each distinct history token by the thread of its
//     first occurrence: the CPU's sorted counting gives the same counts), the greedy token (lowest id among the
//     largest non-NaN logits), then for temperature > 0 s = l / T, m, and the candidates ((double)s - m >= the
//     floor) packed as 64-bit keys key_of(s) << 32 | id (distinct, so their packing order does not matter).
//   one segmented radix sort of each row's candidates (CUB): ascending keys are sampler.cpp's order `before`
//     (s descending, ties by lower id).
//   k_choose (a block per row): w = exp((double)s - m) along the order up to top-k; the tail cut at the first
//     w < 1e-12; then top-p, min-p and the inverse CDF with the CPU's running double sums, in order, by one
//     thread (bit identity of those sums needs their order), the weights staged through shared memory.
// The one bound: w uses the device's double exp (at most 1 ulp from the correctly rounded value; glibc's exp, which
// the CPU uses, is within 1 ulp too), so a weight may differ from the CPU's in its last bit, and a token can
// differ only where the uniform, a top-p / min-p / tail threshold or the running sum falls within a few ulps
// (~1e-16 relative) of a boundary: no such case in the tests' rows.
#include <cuda_runtime.h>

#include <cub/device/device_segmented_radix_sort.cuh>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr double kTailCut = 1e-12;  // sampler.cpp's
constexpr double kTailCutLog = -27.7;

struct RowInfo {
  int32_t n_cand;  // candidates (keys before the all-ones ones); -1: the row is decided (out written)
  double md;       // m = max s, in double
};

struct SampleArgs {
  const float* logits;
  int64_t V;
  float temperature, top_p, min_p, rep, presence, frequency;
  int32_t top_k, last_n;
  bool pen;
  double floor_log;
  uint64_t seed;
  const int32_t* committed;
  int64_t n_committed;
  const int32_t* inputs;
  int64_t pos0;
  int32_t* out;
  int32_t* status;
  float* rows;          // [T][V] the processed rows
  uint64_t* keys;       // [T][V]
  const uint64_t* sorted;  // [T][V]
  double* w;            // [T][V]
  RowInfo* info;        // [T]
  int64_t* seg_begin;   // [T] the sort's segments: row t's candidates
  int64_t* seg_end;     // [T]
};

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ double uniform_at_dev(uint64_t seed, int64_t pos) {
  const uint64_t z = splitmix64(seed ^ splitmix64((uint64_t)pos));
  return __dmul_rn((double)(z >> 11), 0x1.0p-53);
}
__device__ __forceinline__ uint32_t key_of(float s) {
  s = __fadd_rn(s, 0.f);
  uint32_t u = __float_as_uint(s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~u;
}
__device__ __forceinline__ float s_of(uint32_t key) {
  uint32_t u = ~key;
  u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
  return __uint_as_float(u);
}

// Block-wide reductions over kThreads threads (every thread gets the result).
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* red) {
  for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // red may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < kThreads / 32; w++) v = op(v, red[w]);
  return v;
}

__global__ void __launch_bounds__(kThreads) k_prepare(SampleArgs a) {
  pdl_wait();
  __shared__ float redf[32];
  __shared__ long long redi[32];
  const int t = blockIdx.x, tid = threadIdx.x;
  const int64_t V = a.V;
  float* row = a.rows + t * V;
  const float* src = a.logits + t * V;
  for (int64_t i = tid; i < V; i += kThreads) row[i] = src[i];
  __syncthreads();
  if (a.pen) {  // row_history + apply_penalties: the last W tokens of committed ++ inputs[0..t]
    const int64_t have = a.n_committed + t + 1;
    const int64_t W = a.last_n < have ? a.last_n : have;
    const int64_t base = have - W;
    auto at = [&](int64_t i) { return i < a.n_committed ? a.committed[i] : a.inputs[i - a.n_committed]; };
    for (int64_t h = tid; h < W; h += kThreads) {
      const int32_t tok = at(base + h);
      bool first = true;
      int64_t c = 0;
      for (int64_t g = 0; g < W; g++) {
        const int32_t x = at(base + g);
        if (x == tok) {
          if (g < h) first = false;
          c++;
        }
      }
      if (!first || tok < 0 || tok >= V) continue;
      float l = row[tok];
      if (a.rep != 1.f) l = l > 0.f ? __fdiv_rn(l, a.rep) : __fmul_rn(l, a.rep);
      l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)c, a.frequency), a.presence));
      row[tok] = l;
    }
    __syncthreads();
  }
  // argmax: the largest non-NaN logit, then its lowest id
  float bv = -INFINITY;
  for (int64_t i = tid; i < V; i += kThreads) bv = row[i] > bv ? row[i] : bv;
  bv = block_reduce(bv, [](float x, float y) { return y > x ? y : x; }, redf);
  RowInfo* info = a.info + t;
  uint64_t* keys = a.keys + t * V;
  if (tid == 0) a.seg_begin[t] = a.seg_end[t] = t * V;  // a decided row: an empty segment for the sort
  auto decided = [&](int32_t tok, int32_t status) {
    if (tid == 0) {
      a.out[t] = tok;
      a.status[t] = status;
      info->n_cand = -1;
    }
  };
  if (bv == -INFINITY) return decided(-1, 1);
  long long first = V;
  for (int64_t i = tid; i < V; i += kThreads)
    if (row[i] == bv) {
      first = i;
      break;
    }
  const int32_t greedy = (int32_t)block_reduce(first, [](long long x, long long y) { return y < x ? y : x; }, redi);
  if (a.temperature == 0.f) return decided(greedy, 0);
  const float T = a.temperature;
  const float m = __fdiv_rn(row[greedy], T);
  if (isinf(m)) return decided(greedy, 0);
  const double md = m;
  // the candidates, packed in any order (the keys are distinct: the sort's result does not depend on it)
  __shared__ unsigned int n_cand;
  if (tid == 0) n_cand = 0;
  __syncthreads();
  for (int64_t i = tid; i < V; i += kThreads) {
    const float s = __fdiv_rn(row[i], T);
    if (__dsub_rn((double)s, md) >= a.floor_log)  // NaN and -inf fail
      keys[atomicAdd(&n_cand, 1u)] = (uint64_t)key_of(s) << 32 | (uint64_t)i;
  }
  __syncthreads();
  if (tid == 0) {
    info->n_cand = (int32_t)n_cand;
    info->md = md;
    a.status[t] = 0;
    a.seg_end[t] = t * V + n_cand;
  }
}

constexpr int kChunk = 2048;  // weights staged in shared memory for thread 0's running sums

// Thread 0 calls f(j, w[j]) for j = 0, 1, ... < n in order until f returns true; w comes through shared memory
// kChunk at a time, loaded by the whole block (every thread must call). Returns the j that stopped it, or n.
template <class F>
__device__ int64_t walk(const double* w, int64_t n, double* stage, F f) {
  __shared__ int stop;
  __shared__ long long at;
  if (threadIdx.x == 0) {
    stop = 0;
    at = n;
  }
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    __syncthreads();
    if (stop) break;
    for (int i = threadIdx.x; i < kChunk && c0 + i < n; i += kThreads) stage[i] = w[c0 + i];
    __syncthreads();
    if (threadIdx.x == 0) {
      const int m = n - c0 < kChunk ? (int)(n - c0) : kChunk;
      for (int i = 0; i < m; i++)
        if (f(c0 + i, stage[i])) {
          stop = 1;
          at = c0 + i;
          break;
        }
    }
  }
  __syncthreads();
  return at;
}

__global__ void __launch_bounds__(kThreads) k_choose(SampleArgs a) {
  pdl_wait();
  __shared__ long long redi[32];
  __shared__ double stage[kChunk];
  const int t = blockIdx.x, tid = threadIdx.x;
  const RowInfo info = a.info[t];
  if (info.n_cand < 0) return;
  const uint64_t* keys = a.sorted + t * a.V;
  double* w = a.w + t * a.V;
  int64_t lim = info.n_cand;
  if (a.top_k > 0 && a.top_k < lim) lim = a.top_k;
  long long cut = lim;  // the tail cut: the first weight < 1e-12 (exp is monotone: the kept set is a prefix)
  for (int64_t j = tid; j < lim; j += kThreads) {
    const double x = exp(__dsub_rn((double)s_of((uint32_t)(keys[j] >> 32)), info.md));
    w[j] = x;
    if (x < kTailCut && j < cut) cut = j;
  }
  int64_t n = block_reduce(cut, [](long long x, long long y) { return y < x ? y : x; }, redi);  // >= 1: w[0] = 1
  if (a.top_p < 1.f) {
    double total = 0;
    walk(w, n, stage, [&](int64_t, double x) { total = __dadd_rn(total, x); return false; });
    const double thr = __dmul_rn((double)a.top_p, total);
    double cum = 0;
    const int64_t j = walk(w, n, stage, [&](int64_t, double x) {
      cum = __dadd_rn(cum, x);
      return cum >= thr;
    });
    __shared__ long long n_p;
    if (tid == 0) n_p = j < n ? j + 1 : n;
    __syncthreads();
    n = n_p;
  }
  if (a.min_p > 0.f) {  // the first j >= 1 with w[j] < min_p
    const double mp = (double)a.min_p;
    n = 1 + walk(w + 1, n - 1, stage, [&](int64_t, double x) { return !(x >= mp); });
  }
  double total = 0;
  walk(w, n, stage, [&](int64_t, double x) { total = __dadd_rn(total, x); return false; });
  double target = 0, cum = 0;
  if (tid == 0) target = __dmul_rn(uniform_at_dev(a.seed, a.pos0 + t + 1), total);
  const int64_t j = walk(w, n, stage, [&](int64_t, double x) {
    cum = __dadd_rn(cum, x);
    return cum > target;
  });
  if (tid == 0) a.out[t] = (int32_t)(keys[j < n ? j : n - 1] & 0xffffffffu);
}

struct Layout {
  size_t rows, keys, sorted, w, info, offsets, temp, total;
};
Layout layout(int T, int64_t V) {
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t n = (size_t)T * V;
  Layout L;
  size_t temp = 0;
  cub::DeviceSegmentedRadixSort::SortKeys(nullptr, temp, (const uint64_t*)nullptr, (uint64_t*)nullptr, (int64_t)n, T,
                                          (const int64_t*)nullptr, (const int64_t*)nullptr, 0, 64);
  L.rows = 0;
  L.keys = L.rows + up(n * 4);
  L.sorted = L.keys + up(n * 8);
  L.w = L.sorted + up(n * 8);
  L.info = L.w + up(n * 8);
  L.offsets = L.info + up((size_t)T * sizeof(RowInfo));
  L.temp = L.offsets + up((size_t)T * 16);
  L.total = L.temp + up(temp);
  return L;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: ", what, ": ", cudaGetErrorString(e));
}

}  // namespace

size_t sample_scratch_bytes(int T, int64_t n_vocab) { return layout(T, n_vocab).total; }

namespace {

constexpr int kArgmaxThreads = 512;

// A block per row: sampler.cpp argmax, the largest non-NaN logit (NaN never wins a `>`; +0 / -0 compare equal in
// the second pass, so which zero the max keeps does not matter), then the lowest id holding it; `none` when that
// largest is -inf (every logit NaN or -inf).
__global__ void __launch_bounds__(kArgmaxThreads) k_argmax(const float* logits, int64_t V, int32_t none, int32_t* out) {
  pdl_wait();
  __shared__ float redf[32];
  __shared__ long long redi[32];
  const float* row = logits + blockIdx.x * V;
  float bv = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads) bv = row[i] > bv ? row[i] : bv;
  for (int o = 16; o; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, bv, o);
    bv = y > bv ? y : bv;
  }
  if ((threadIdx.x & 31) == 0) redf[threadIdx.x >> 5] = bv;
  __syncthreads();
  bv = redf[0];
  for (int w = 1; w < kArgmaxThreads / 32; w++) bv = redf[w] > bv ? redf[w] : bv;
  if (bv == -INFINITY) {
    if (threadIdx.x == 0) out[blockIdx.x] = none;
    return;
  }
  long long first = V;
  for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads)
    if (row[i] == bv) {
      first = i;
      break;
    }
  for (int o = 16; o; o >>= 1) {
    const long long y = __shfl_xor_sync(0xffffffffu, first, o);
    first = y < first ? y : first;
  }
  if ((threadIdx.x & 31) == 0) redi[threadIdx.x >> 5] = first;
  __syncthreads();
  if (threadIdx.x == 0) {
    first = redi[0];
    for (int w = 1; w < kArgmaxThreads / 32; w++) first = redi[w] < first ? redi[w] : first;
    out[blockIdx.x] = (int32_t)first;
  }
}

}  // namespace

void argmax_rows(const float* logits, int T, int64_t n_vocab, int32_t none, int32_t* out, void* stream) {
  STRATA_CHECK(T >= 1 && n_vocab >= 1 && n_vocab <= INT32_MAX, "cuda argmax_rows: T = ", T, ", n_vocab = ", n_vocab);
  launch(k_argmax, (unsigned)T, kArgmaxThreads, 0, static_cast<cudaStream_t>(stream), logits, n_vocab, none, out);
  check(cudaGetLastError(), "launch of the argmax kernel");
}

void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                 int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out, int32_t* status,
                 void* scratch, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const Layout L = layout(T, n_vocab);
  char* base = static_cast<char*>(scratch);
  SampleArgs a;
  a.logits = logits;
  a.V = n_vocab;
  a.temperature = p.temperature;
  a.top_p = p.top_p;
  a.min_p = p.min_p;
  a.rep = p.repetition_penalty;
  a.presence = p.presence_penalty;
  a.frequency = p.frequency_penalty;
  a.top_k = p.top_k;
  a.last_n = p.penalty_last_n;
  a.pen = p.penalties_active();
  a.floor_log = kTailCutLog;  // sampler.cpp: without top-p, min-p may cut the candidates already (in log space)
  if (p.top_p >= 1.f && p.min_p > 0.f) a.floor_log = std::max(a.floor_log, std::log((double)p.min_p) - 1e-6);
  a.seed = p.seed;
  a.committed = committed;
  a.n_committed = n_committed;
  a.inputs = inputs;
  a.pos0 = pos0;
  a.out = out;
  a.status = status;
  a.rows = reinterpret_cast<float*>(base + L.rows);
  a.keys = reinterpret_cast<uint64_t*>(base + L.keys);
  a.sorted = reinterpret_cast<uint64_t*>(base + L.sorted);
  a.w = reinterpret_cast<double*>(base + L.w);
  a.info = reinterpret_cast<RowInfo*>(base + L.info);
  a.seg_begin = reinterpret_cast<int64_t*>(base + L.offsets);
  a.seg_end = a.seg_begin + T;
  launch(k_prepare, (unsigned)T, kThreads, 0, st, a);
  check(cudaGetLastError(), "launch of the sampling kernel (prepare)");
  if (p.temperature == 0.f) return;
  size_t temp = L.total - L.temp;
  check(cub::DeviceSegmentedRadixSort::SortKeys(base + L.temp, temp, a.keys, const_cast<uint64_t*>(a.sorted),
                                                (int64_t)T * n_vocab, T, a.seg_begin, a.seg_end, 0, 64, st),
        "the sampling sort");
  launch(k_choose, (unsigned)T, kThreads, 0, st, a);
  check(cudaGetLastError(), "launch of the sampling kernel (choose)");
}

}  // namespace strata::cuda
