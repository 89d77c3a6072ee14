// Attention on the card (ops_cuda.h attend): attend_ref's float32 operations in attend_ref's order, so the result
// equals it bit for bit. Two kernels:
//   1. k_scores (row x head, blocks of 256 cells): a 16-thread group per cell; lane i sums q[i'] * k[i'] over
//      i' = i (mod 16) in increasing i' (dot16's lanes, tail included), then dot16's tree by shuffles; times scale.
//   k_softmax_v (a block per (row, head)):
//   2. the maximum: order-free (NaN never wins a comparison, and a +0 / -0 tie changes no x - mx);
//      exp_shift: sc[c] = exp_inl(sc[c] - mx), rowops' polynomial ported to the device (exp_inl.cuh).
//   3. sum: one running float sum in increasing c (attend_ref's order: one thread, the price of bit identity).
//   4. o[d] = sum over c in increasing c of (sc[c] * inv) * v[c][d]: a thread per d, cells staged in shared memory.
// Prompt pieces (many queries: T x nh >= g_tile_queries, hd 64 / 128 / 256) take two tiled kernels instead, so that
// each key and value staged in shared memory serves a whole tile of queries (the kernels above read them again for
// every (row, head): a 512-row piece of the 80B file spent ~2 ms a KV head there). Each output keeps its operations
// and their order, so the bits are the same:
//   k_scores_tiles (a block per 32 queries x 32 cells): a thread takes 2 queries x 2 cells and keeps dot16's 16
//      lanes for each pair in registers (lane i: the products of i' = i (mod 16) in increasing i'), then dot16's
//      tree in registers, times scale.
//   k_softmax_v_tiles<HD> (a block per 4096 / HD queries): the maximum a warp per query; exp_shift; the running sum
//      a thread per query in increasing c; o with a thread per 4 queries x 4 d, values and p staged 32 cells a pass,
//      each o[d] added in increasing c (cells a query does not see are skipped, never added as zeros).
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>

#include "kernels/cuda/exp_inl.cuh"
#include "kernels/cuda/lanes16.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 32;  // V loads issued together in the output loop
constexpr int kCellsPerScoreBlock = 256;  // 16 groups of 16 lanes, 16 cells each
constexpr int kStage = 4 * kThreads;      // cells staged in shared memory for the running sum
constexpr int kScoreRegs = 16;            // k_scores: values a lane holds in registers (hd <= 256: all)

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
  // The lane's first kScoreRegs query values (i = lane + 16 m) held in registers for all its cells, and each cell's
  // key values loaded together before the chain: one memory round trip a cell instead of one a value (a loop over
  // a runtime hd issued them one at a time: 18 us a call on the 80B file at T = 1). The chain is unchanged:
  // l += q[i] * k[i] in increasing i, then the values past 16 kScoreRegs in the same loop as before.
  float qv[kScoreRegs];
#pragma unroll
  for (int m = 0; m < kScoreRegs; m++) qv[m] = lane + 16 * m < a.hd ? __ldg(q + lane + 16 * m) : 0.f;
#pragma unroll 4
  for (int j = 0; j < kCellsPerScoreBlock / 16; j++) {
    const int64_t c = c_base + j * 16 + g;
    const bool in = c < n;
    float l = 0.f;
    if (in) {
      const float* key = a.k + (a.cells ? (int64_t)a.cells[c] : c) * a.ldkv;
      float kv[kScoreRegs];
#pragma unroll
      for (int m = 0; m < kScoreRegs; m++) kv[m] = lane + 16 * m < a.hd ? __ldg(key + lane + 16 * m) : 0.f;
#pragma unroll
      for (int m = 0; m < kScoreRegs; m++)
        if (lane + 16 * m < a.hd) l = __fadd_rn(l, __fmul_rn(qv[m], kv[m]));
      for (int64_t i = lane + 16 * kScoreRegs; i < a.hd; i += 16)
        l = __fadd_rn(l, __fmul_rn(__ldg(q + i), __ldg(key + i)));
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

constexpr int kTileQ = 32;      // queries a scores tile
constexpr int kTileC = 32;      // cells a scores tile
constexpr int kTileHd = 64;     // head dims staged a pass
constexpr int kTilePad = 4;     // floats after each staged row: 8 consecutive rows' float4 hit distinct banks
bool g_tiles = true;            // prefer_attn_tiles
int64_t g_tile_queries = 1024;  // the least T x nh that takes the tiled kernels

// row t, head h of query q (q = t * nh + h, the scratch's row order)
__device__ __forceinline__ const float* query_at(const AttendArgs& a, int q) {
  return a.q + (q / a.nh) * a.ldq_t + (q % a.nh) * a.ldq_h;
}

// sc[q][c] for kTileQ queries x kTileC cells; hd % kTileHd == 0, rows 16-byte aligned (the caller checks).
__global__ void __launch_bounds__(kThreads, 2) k_scores_tiles(AttendArgs a, float* __restrict__ scratch, int64_t stride,
                                                           const int32_t* __restrict__ n_dev) {
  pdl_wait();
  __shared__ __align__(16) float qs[kTileQ][kTileHd + kTilePad];
  __shared__ __align__(16) float ks[kTileC][kTileHd + kTilePad];
  const int tid = threadIdx.x;
  const int nq = a.T * a.nh, q0 = blockIdx.x * kTileQ;
  const int64_t c0 = (int64_t)blockIdx.y * kTileC, n = n_dev ? (int64_t)*n_dev : a.n;
  const int64_t n_hi = n + (min(q0 + kTileQ, nq) - 1) / a.nh;  // cells the tile's last row sees
  if (c0 >= n_hi) return;  // the whole block
  const int qp = tid >> 4, cp = tid & 15;  // this thread: queries q0 + qp + 16 x, cells c0 + cp + 16 y
  float l[2][2][16];
#pragma unroll
  for (int x = 0; x < 2; x++)
#pragma unroll
    for (int y = 0; y < 2; y++)
#pragma unroll
      for (int i = 0; i < 16; i++) l[x][y][i] = 0.f;
  for (int64_t i0 = 0; i0 < a.hd; i0 += kTileHd) {
    __syncthreads();
    for (int e = tid; e < kTileQ * kTileHd / 4; e += kThreads) {  // kTileQ == kTileC rows of each
      const int r = e / (kTileHd / 4), j = e % (kTileHd / 4) * 4;
      const int q = q0 + r;
      const int64_t c = c0 + r;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f), y = x;
      if (q < nq) x = *reinterpret_cast<const float4*>(query_at(a, q) + i0 + j);
      if (c < n_hi) y = *reinterpret_cast<const float4*>(a.k + c * a.ldkv + i0 + j);
      *reinterpret_cast<float4*>(&qs[r][j]) = x;
      *reinterpret_cast<float4*>(&ks[r][j]) = y;
    }
    __syncthreads();
#pragma unroll
    for (int j0 = 0; j0 < kTileHd; j0 += 16) pairs16<false>(l, &qs[0][0], &ks[0][0], kTileHd + kTilePad, qp, cp, j0);
  }
#pragma unroll
  for (int x = 0; x < 2; x++) {
    const int q = q0 + qp + 16 * x;
    if (q >= nq) continue;
    const int64_t nt = n + q / a.nh;
    float* sc = scratch + (int64_t)q * stride;
#pragma unroll
    for (int y = 0; y < 2; y++) {
      const int64_t c = c0 + cp + 16 * y;
      if (c < nt) sc[c] = __fmul_rn(tree16(l[x][y]), a.scale);
    }
  }
}

// The softmax and o for 4096 / HD queries a block, from k_scores_tiles' sc.
template <int HD>
__global__ void __launch_bounds__(kThreads) k_softmax_v_tiles(AttendArgs a, float* __restrict__ scratch,
                                                              int64_t stride, const int32_t* __restrict__ n_dev) {
  pdl_wait();
  constexpr int kDq = HD / 4;            // threads across a row of o (a float4 each)
  constexpr int kQg = kThreads / kDq;    // groups of 4 queries
  constexpr int kQv = 4 * kQg;           // queries a block
  constexpr int kCells = 32;             // cells staged a pass
  static_assert(kDq * kQg == kThreads && kQv % (kThreads / 32) == 0, "k_softmax_v_tiles: HD");
  __shared__ __align__(16) float vs[kCells][HD];
  __shared__ __align__(16) float ps[kCells][kQv];  // p of cell c for the block's query i
  __shared__ float inv_s[kQv];
  __shared__ int64_t nt_s[kQv];  // cells query i of the block sees (0 past the last query)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nq = a.T * a.nh, q0 = blockIdx.x * kQv;
  const int64_t n = n_dev ? (int64_t)*n_dev : a.n;
  if (tid < kQv) nt_s[tid] = q0 + tid < nq ? n + (q0 + tid) / a.nh : 0;
  __syncthreads();

  // the maximum and exp_shift, a warp per query
  for (int i = warp; i < kQv; i += kThreads / 32) {
    const int64_t nt = nt_s[i];
    float* sc = scratch + (int64_t)(q0 + i) * stride;
    float mx = -INFINITY;
    for (int64_t c = lane; c < nt; c += 32) mx = max_nan_loses(mx, sc[c]);
    for (int o = 16; o; o >>= 1) mx = max_nan_loses(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int64_t c = lane; c < nt; c += 32) sc[c] = exp_inl_dev(__fsub_rn(sc[c], mx));
  }
  __syncthreads();
  // attend_ref's running sum in cell order, a thread per query (32 loads in flight: the sum waits on L2 otherwise)
  if (tid < kQv) {
    const int64_t nt = nt_s[tid];
    const float* sc = scratch + (int64_t)(q0 + tid) * stride;
    float sum = 0.f;
#pragma unroll 32
    for (int64_t c = 0; c < nt; c++) sum = __fadd_rn(sum, sc[c]);
    inv_s[tid] = __fdiv_rn(1.f, sum);
  }
  __syncthreads();

  const int dq = tid % kDq, qg = tid / kDq;  // this thread: d = 4 dq .. 4 dq + 3 of queries 4 qg .. 4 qg + 3
  int64_t nt[4];
#pragma unroll
  for (int x = 0; x < 4; x++) nt[x] = nt_s[4 * qg + x];
  const int64_t n_lo = nt_s[0], n_hi = n + ((q0 + kQv < nq ? q0 + kQv : nq) - 1) / a.nh;  // first and last query's
  float acc[4][4];
#pragma unroll
  for (int x = 0; x < 4; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[x][e] = 0.f;
  for (int64_t c0 = 0; c0 < n_hi; c0 += kCells) {
    __syncthreads();
    for (int e = tid; e < kCells * kDq; e += kThreads) {
      const int r = e / kDq, j = e % kDq * 4;
      float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c0 + r < n_hi) y = *reinterpret_cast<const float4*>(a.v + (c0 + r) * a.ldkv + j);
      *reinterpret_cast<float4*>(&vs[r][j]) = y;
    }
    for (int e = tid; e < kCells * kQv; e += kThreads) {
      const int r = e / kQv, i = e % kQv;
      ps[r][i] = c0 + r < nt_s[i] ? __fmul_rn(scratch[(int64_t)(q0 + i) * stride + c0 + r], inv_s[i]) : 0.f;
    }
    __syncthreads();
    const int m = n_hi - c0 < kCells ? (int)(n_hi - c0) : kCells;
    // cell r into the thread's 4 x 4 outputs; check: skip the queries that do not see it
    auto cell = [&](int r, bool check) {
      const float4 v = *reinterpret_cast<const float4*>(&vs[r][4 * dq]);
      const float4 p = *reinterpret_cast<const float4*>(&ps[r][4 * qg]);
      const float pv[4] = {p.x, p.y, p.z, p.w}, vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int x = 0; x < 4; x++)
        if (!check || c0 + r < nt[x])
#pragma unroll
          for (int e = 0; e < 4; e++) acc[x][e] = __fadd_rn(acc[x][e], __fmul_rn(pv[x], vv[e]));
    };
    if (c0 + m <= n_lo) {  // every query of the block sees every staged cell
#pragma unroll 4
      for (int r = 0; r < m; r++) cell(r, false);
    } else {
      for (int r = 0; r < m; r++) cell(r, true);
    }
  }
#pragma unroll
  for (int x = 0; x < 4; x++) {
    const int q = q0 + 4 * qg + x;
    if (q < nq)
      *reinterpret_cast<float4*>(a.o + (q / a.nh) * a.ldo_t + (q % a.nh) * a.ldo_h + 4 * dq) =
          make_float4(acc[x][0], acc[x][1], acc[x][2], acc[x][3]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether a takes the tiled kernels: many queries, no cell list, hd 64 / 128 / 256, every row 16-byte aligned.
bool tiles_for(const AttendArgs& a) {
  return g_tiles && !a.cells && (int64_t)a.T * a.nh >= g_tile_queries && (a.hd == 64 || a.hd == 128 || a.hd == 256) &&
         aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.o) &&
         (a.ldq_t | a.ldq_h | a.ldkv | a.ldo_t | a.ldo_h) % 4 == 0;
}

}  // namespace

void prefer_attn_tiles(bool on, int64_t min_queries) {
  STRATA_CHECK(min_queries >= 1, "prefer_attn_tiles: min_queries = ", min_queries);
  g_tiles = on;
  g_tile_queries = min_queries;
}

void attend(const AttendArgs& a, float* scratch, void* stream, const int32_t* n_dev) {
  STRATA_CHECK(!a.cells || a.T == 1, "attend: a cell list needs T = 1, got T = ", a.T);
  STRATA_CHECK(a.T >= 1 && a.nh >= 1 && a.hd >= 1 && a.n >= 0, "attend: T = ", a.T, ", nh = ", a.nh, ", hd = ", a.hd,
               ", n = ", a.n);
  const int64_t stride = a.n + a.T;  // row t, head h uses n + t <= stride floats (attend_scratch has more)
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (tiles_for(a)) {
    const int64_t nq = (int64_t)a.T * a.nh, cell_tiles = (a.n + a.T - 1 + kTileC - 1) / kTileC;
    STRATA_CHECK(cell_tiles < 65536, "cuda attend: ", a.n, " cells are more than one launch covers");
    if (cell_tiles > 0)
      launch(k_scores_tiles, dim3((unsigned)((nq + kTileQ - 1) / kTileQ), (unsigned)cell_tiles), kThreads, 0, st, a,
             scratch, stride, n_dev);
    const unsigned blocks = (unsigned)((nq + 4096 / a.hd - 1) / (4096 / a.hd));
    if (a.hd == 64) launch(k_softmax_v_tiles<64>, blocks, kThreads, 0, st, a, scratch, stride, n_dev);
    if (a.hd == 128) launch(k_softmax_v_tiles<128>, blocks, kThreads, 0, st, a, scratch, stride, n_dev);
    if (a.hd == 256) launch(k_softmax_v_tiles<256>, blocks, kThreads, 0, st, a, scratch, stride, n_dev);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the tiled attention kernels: ", cudaGetErrorString(e));
    return;
  }
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
