// CUDA T-row products and norms: see matmul_cuda.h for the contract, decode.cuh for the block formats.
#include <cub/block/block_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode.cuh"
#include "kernels/cuda/exp_inl.cuh"
#include "kernels/cuda/lanes16.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_cuda.h"
#include "kernels/iq_tables.h"
#include "kernels/quants.h"
#include "kernels/blocks32.h"
#include "kernels/types.h"
#include "model/limits.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

constexpr int kRowsPerBlock = 16;  // weight rows per thread block: 16 rows x 16 lanes = 256 threads
constexpr int kMaxT = 16;          // activation rows a block sums (more rows: blocks in y, or several launches)
constexpr int kMaxPassRows = 4096;  // activation rows a launch takes (a prompt piece in one; the 32-value block types: kMaxT)
constexpr int64_t kMaxIntBlocks = 4096;  // int8-activation products at T = 1: a block per row group up to this (grid-stride past it)
constexpr int64_t kRowsForR4 = (int64_t)kRowsPerBlock * 4 * 132 * 8;  // 67584 (tests/test_cuda_matmul.py)

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: ", what, ": ", cudaGetErrorString(e));
}

// 1: the dense products (no expert selection) prefetch their block's first weight rows toward L2 before pdl_wait,
// so that the weights' DRAM latency overlaps the kernel before (launch.cuh). init_tables / prefer_pdl set it.
__constant__ int c_prefetch;
__device__ __forceinline__ void prefetch_rows(const uint8_t* W, size_t row_bytes, int64_t rows, int64_t r0, int64_t n) {
  if (c_prefetch && threadIdx.x == 0 && blockIdx.y == 0 && r0 < rows)  // grid rows y > 0: the same weights
    pdl_prefetch(W + r0 * row_bytes, (size_t)(n < rows - r0 ? n : rows - r0) * row_bytes);
}

// matmul.h's tree over the 16 lanes of a row (lane j of the 16-thread group holds l[j]); lane 0 gets the sum.
__device__ __forceinline__ float reduce16(float l) {
  l = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 8, 16));  // s8[j] = l[j] + l[j + 8]
  l = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 4, 16));  // s4[j] = s8[j] + s8[j + 4]
  l = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 2, 16));  // s2[j] = s4[j] + s4[j + 2]
  return __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 1, 16));  // s2[0] + s2[1]
}

// Float activations: lane j accumulates columns c = j (mod 16) in increasing c, zero-padded to a multiple of 16.
// Each thread holds lane j of R weight rows (R = 4 on large matrices: one load of x serves 4 rows; R = 1 keeps
// small matrices spread over more threads). A thread block holds blockDim.x / 16 row groups (64 threads on small
// matrices: more blocks over the SMs). The launch shape never changes what a lane computes.
// Expert selection (matmul_sel): with sel, grid row blockIdx.y is slot s, its weight the matrix at W + sel[s] *
// ebytes, its activation row s / xdiv, its output row s (T = 1 per slot).
template <class D, int TT, int R>
__global__ void __launch_bounds__(256) k_float(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows,
                                               int64_t cols, const float* __restrict__ x, int64_t ldx, int T,
                                               float* __restrict__ y, int64_t ldy, const int32_t* __restrict__ sel,
                                               size_t ebytes, int xdiv) {
  if (!sel) prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * (blockDim.x >> 4) * R, (blockDim.x >> 4) * R);
  pdl_wait();
  if (sel) {
    const int slot = blockIdx.y;
    W += (size_t)sel[slot] * ebytes;
    x += (int64_t)(slot / xdiv) * ldx;
    y += (int64_t)slot * ldy;
  } else if (gridDim.y > 1) {  // small matrices, T > 1: activation rows TT y .. TT y + TT - 1 (TT = 1: row y alone)
    x += (int64_t)blockIdx.y * TT * ldx;
    y += (int64_t)blockIdx.y * TT * ldy;
    T = T - (int)blockIdx.y * TT < TT ? T - (int)blockIdx.y * TT : TT;
  }
  const int lane = threadIdx.x & 15;
  const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4)) * R;
  const uint8_t* row[R];
#pragma unroll
  for (int i = 0; i < R; i++) row[i] = W + (r0 + i < rows ? r0 + i : 0) * row_bytes;  // all threads shuffle
  float acc[R][TT];
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int t = 0; t < TT; t++) acc[i][t] = 0.f;
  const int64_t padded = (cols + 15) / 16 * 16;
  // kU columns of the lane's weights loaded into registers before the chain consumes them (the chain's order is
  // unchanged): one memory round trip per kU columns instead of one per column. F32 rows (the MoE routers, on the
  // routed experts' path every layer): 32, half the round trips.
  constexpr int kU = R == 1 ? (std::is_same_v<D, F32> ? 32 : 16) : 4;
  for (int64_t c0 = lane; c0 < padded; c0 += 16 * kU) {
    float w[kU][R];
#pragma unroll
    for (int u = 0; u < kU; u++) {
      const int64_t c = c0 + 16 * u;
#pragma unroll
      for (int i = 0; i < R; i++) w[u][i] = c < cols ? D::value(row[i], c) : 0.f;
    }
#pragma unroll
    for (int t = 0; t < TT; t++)
      if (t < T) {
        float xv[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) xv[u] = c0 + 16 * u < cols ? __ldg(x + t * ldx + c0 + 16 * u) : 0.f;
#pragma unroll
        for (int u = 0; u < kU; u++)
          if (c0 + 16 * u < padded)
#pragma unroll
            for (int i = 0; i < R; i++) acc[i][t] = fmaf(w[u][i], xv[u], acc[i][t]);
      }
  }
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int t = 0; t < TT; t++) {
      if (t >= T) break;
      const float s = reduce16(acc[i][t]);
      if (lane == 0 && r0 + i < rows) y[t * ldy + r0 + i] = s;
    }
}

// Float products of many activation rows (prompt pieces: the F32 routers, 512 x 2048, every layer): a block per 32
// activation rows x 32 weight rows, both staged in shared memory 64 columns at a time, so that each weight value
// loaded serves 32 activation rows (k_float reads the router again for every row). A thread takes 2 x 2 (row,
// weight row) pairs and keeps k_float's 16 lanes of each in registers: lane j = fma(w, x, lane j) over the columns
// c = j (mod 16) in increasing c, up to the zero-padded multiple of 16 and no further; then reduce16's tree. So
// each output is k_float's, bit for bit.
constexpr int kFloatTile = 32;      // activation rows and weight rows a block
constexpr int kFloatTileCols = 64;  // columns staged a pass
constexpr int kFloatTileMinT = 32;  // from this many activation rows every float product takes the tiles
// Windows of 16..31 rows take them only over matrices of 4096+ rows (the default model's 8192 x 256 Q8_0 head: a
// 16-row window on k_float<Q8_0, 16> 53.8 us against ~3.5 at T = 1; C(16) / C(1) 2.38-2.54 -> 2.33-2.35 on an H100,
// docs/BENCHMARKS.md session 33); its small in-layer products stay on k_float (all of them on the tiles from 16 rows:
// C(16) / C(1) 3.36). prefer_float_tiles sets both bounds.
constexpr int kFloatTileWindowT = 16;
constexpr int64_t kFloatTileWindowRows = 4096;
bool g_float_tiles = true;  // prefer_float_tiles
int g_float_tiles_min_t = kFloatTileWindowT;
int64_t g_float_tiles_min_w = kFloatTileWindowRows;

template <class D>
__global__ void __launch_bounds__(256, 2) k_float_tiles(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows,
                                                        int64_t cols, const float* __restrict__ x, int64_t ldx, int T,
                                                        float* __restrict__ y, int64_t ldy) {
  prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * kFloatTile, kFloatTile);
  pdl_wait();
  __shared__ __align__(16) float xs[kFloatTile][kFloatTileCols + 4];  // + 4: 8 consecutive rows' float4, 8 banks
  __shared__ __align__(16) float ws[kFloatTile][kFloatTileCols + 4];
  const int tid = threadIdx.x, tp = tid >> 4, rp = tid & 15;  // rows t0 + tp + 16 a, weight rows r0 + rp + 16 b
  const int t0 = (int)blockIdx.y * kFloatTile;
  const int64_t r0 = (int64_t)blockIdx.x * kFloatTile, padded = (cols + 15) / 16 * 16;
  float l[2][2][16];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int b = 0; b < 2; b++)
#pragma unroll
      for (int i = 0; i < 16; i++) l[a][b][i] = 0.f;
  for (int64_t i0 = 0; i0 < padded; i0 += kFloatTileCols) {
    __syncthreads();
    for (int e = tid; e < kFloatTile * kFloatTileCols; e += 256) {
      const int r = e / kFloatTileCols, j = e % kFloatTileCols;
      const int64_t c = i0 + j;
      xs[r][j] = t0 + r < T && c < cols ? x[(int64_t)(t0 + r) * ldx + c] : 0.f;
      ws[r][j] = r0 + r < rows && c < cols ? D::value(W + (r0 + r) * row_bytes, c) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kFloatTileCols / 16; g++) {
      if (i0 + 16 * g >= padded) break;  // the block's columns end at the padding, as k_float's
      pairs16<true>(l, &xs[0][0], &ws[0][0], kFloatTileCols + 4, tp, rp, 16 * g);
    }
  }
#pragma unroll
  for (int a = 0; a < 2; a++) {
    const int t = t0 + tp + 16 * a;
#pragma unroll
    for (int b = 0; b < 2; b++) {
      const int64_t r = r0 + rp + 16 * b;
      if (t < T && r < rows) y[(int64_t)t * ldy + r] = tree16(l[a][b]);
    }
  }
}

// Selections of at least kTileMinSlots slots (prompt pieces, long windows) are grouped by expert: k_sel_tiles sorts
// the slots by (expert, slot) and cuts each expert's run into tiles of at most kTileRows slots; the product kernels
// then decode a weight row once per tile and sum it against every slot of the tile (k_iq2xxs_tiles, k_int's kTiled).
// A block per slot re-decodes the expert for each slot (a 64-row prompt piece of the 80B file: 640 slots over ~365
// experts, ~200 000 blocks a layer). Which block computes a slot never changes its value: each slot's row is the
// one-row kernel's operations in its order (tests/test_cuda_forward.py, the "tiles" shapes).
constexpr int kTileRows = 16;        // slots of one expert per tile
constexpr int kTileMaxSlots = 8192;  // slots grouped by one k_sel_tiles launch (more: pieces of whole rows); a
                                     // 512-row prompt piece of top-10 routing is 5120
constexpr int kTileMinSlots = 64;    // fewer slots: a block per slot (k_iq2xxs_warp1, k_int<D, 1>)
constexpr int kTileBlocksY = 64;     // tiles in flight (blocks in y, each over tiles y, y + 64, ...)
constexpr int kSelThreads = 1024;    // k_sel_tiles' block: kSelPer sorted places a thread
constexpr int kSelPer = kTileMaxSlots / kSelThreads;
constexpr int kSelSlotBits = 13;     // a key's slot field: kTileMaxSlots = 2^13
static_assert(kTileMaxSlots == 1 << kSelSlotBits && kSelPer * kSelThreads == kTileMaxSlots, "k_sel_tiles' layout");
static_assert(model_limits::kMaxExperts <= (int64_t)1 << (32 - kSelSlotBits), "k_sel_tiles: an expert id fits a key");

// The exclusive scan over the block's 1024 threads of v (identity 0; op: + or max), by warp shuffles and the warps'
// totals in wsum[32]. Every thread of the block calls it (it has barriers).
template <class Op>
__device__ __forceinline__ int block_exclusive_scan(int v, Op op, int* wsum) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl = op(incl, o);
  }
  int excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = 0;
  if (lane == 31) wsum[w] = incl;
  __syncthreads();
  if (w == 0) {
    int ti = wsum[lane];  // kSelThreads / 32 == 32 warps
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, ti, d);
      if (lane >= d) ti = op(ti, o);
    }
    const int te = __shfl_up_sync(0xffffffffu, ti, 1);
    wsum[lane] = lane == 0 ? 0 : te;
  }
  __syncthreads();
  const int r = op(excl, wsum[w]);
  __syncthreads();  // wsum is free again
  return r;
}

// Slots [base, base + m) of sel (m <= kTileMaxSlots) grouped by expert, sorted by (expert, slot): tile j has tile_e[j]
// (the expert), tile_n[j] (its slot count) and tile_slot[16 j + p] (its slots, 0 past the count); ntiles[0] = the
// tile count. The keys (expert << 13 | slot - base) are unique, so any correct sort has one result whatever the
// schedule: the order, the tiles and their numbering never depend on it. Up to kSelBitonicMax slots a bitonic sort in
// shared memory (its passes grow with m: a verify window's 128 slots take a few of them), past it CUB's block radix
// sort over the keys' low 13 + b bits, b the bits of the largest expert id present (the padding keys, all ones, sort
// last: a real key's slot field is below m <= 8191 wherever there is padding). On a 512-row piece of top-10 routing
// (5120 slots, H100 ncu) the bitonic sort took 93 us, the radix sort 27 us; the radix sort's cost hardly depends on m
// (it ranks all 8192 places), so a default-model window of 16 rows (128 slots) took ~20 us more with it: C(16) / C(1)
// 2.41 -> 2.52-2.67 (docs/BENCHMARKS.md session 32). Each expert's sorted run is cut into tiles at 0, 16, 32, ...
// places from its start (the run starts by a max-scan, the tiles numbered by a sum scan); a launch of kSelThreads
// threads, thread i holding the sorted places kSelPer i .. kSelPer i + kSelPer - 1 (CUB's blocked arrangement).
constexpr int kSelBitonicMax = 1024;
using SelSort = cub::BlockRadixSort<uint32_t, kSelThreads, kSelPer>;
__global__ void __launch_bounds__(kSelThreads) k_sel_tiles(const int32_t* __restrict__ sel, int base, int m,
                                                          int32_t* __restrict__ tile_e, int32_t* __restrict__ tile_n,
                                                          int32_t* __restrict__ tile_slot,
                                                          int32_t* __restrict__ ntiles) {
  pdl_wait();
  __shared__ union {
    typename SelSort::TempStorage sort;
    uint32_t key[kTileMaxSlots];
  } sm;
  __shared__ int wsum[32];
  const int i0 = threadIdx.x * kSelPer;
  uint32_t* key = sm.key;
  if (m <= kSelBitonicMax) {
    int n2 = 64;  // m padded to a power of two with keys above every real one
    while (n2 < m) n2 <<= 1;
    for (int i = threadIdx.x; i < n2; i += blockDim.x)
      key[i] = i < m ? (uint32_t)sel[base + i] << kSelSlotBits | (uint32_t)i : 0xffffffffu;
    __syncthreads();
    for (int k = 2; k <= n2; k <<= 1)  // bitonic sort, ascending
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = threadIdx.x; i < n2; i += blockDim.x) {
          const int p = i ^ j;
          if (p > i) {
            const uint32_t a = key[i], b = key[p];
            if ((a > b) == ((i & k) == 0)) {
              key[i] = b;
              key[p] = a;
            }
          }
        }
        __syncthreads();
      }
  } else {
    uint32_t k8[kSelPer], emax = 0;
#pragma unroll
    for (int u = 0; u < kSelPer; u++) {
      const int i = i0 + u;
      const uint32_t e = i < m ? (uint32_t)sel[base + i] : 0u;
      emax = e > emax ? e : emax;
      k8[u] = i < m ? e << kSelSlotBits | (uint32_t)i : 0xffffffffu;
    }
    const int emax_all = block_exclusive_scan((int)emax, [](int a, int b) { return a > b ? a : b; }, wsum);
    __shared__ int top;  // the largest expert id: the last thread's exclusive max and its own
    if (threadIdx.x == kSelThreads - 1) top = emax_all > (int)emax ? emax_all : (int)emax;
    __syncthreads();
    const int ebits = 32 - __clz(top | 1);
    SelSort(sm.sort).Sort(k8, 0, kSelSlotBits + ebits);
    __syncthreads();  // the sort's storage is free: the keys go where it was
#pragma unroll
    for (int u = 0; u < kSelPer; u++) key[i0 + u] = k8[u];
    __syncthreads();
  }
  auto expert = [&](int i) { return key[i] >> kSelSlotBits; };
  // each place's run start: the max over earlier places of the heads' places
  int start[kSelPer], run = 0;
#pragma unroll
  for (int u = 0; u < kSelPer; u++) {
    const int i = i0 + u;
    if (i < m && (i == 0 || expert(i) != expert(i - 1))) run = i;
    start[u] = run;
  }
  const int before = block_exclusive_scan(run, [](int a, int b) { return a > b ? a : b; }, wsum);
  int heads = 0;
#pragma unroll
  for (int u = 0; u < kSelPer; u++) {
    const int i = i0 + u;
    if (start[u] < before) start[u] = before;  // the run began in an earlier thread
    heads += i < m && (i - start[u]) % kTileRows == 0;
  }
  int j = block_exclusive_scan(heads, [](int a, int b) { return a + b; }, wsum);
  if (threadIdx.x == kSelThreads - 1) ntiles[0] = j + heads;
#pragma unroll
  for (int u = 0; u < kSelPer; u++) {
    const int i = i0 + u;
    if (i >= m || (i - start[u]) % kTileRows != 0) continue;
    const uint32_t e = expert(i);
    int cnt = 1;
    while (cnt < kTileRows && i + cnt < m && expert(i + cnt) == e) cnt++;
    tile_e[j] = (int32_t)e;
    tile_n[j] = cnt;
    for (int p = 0; p < kTileRows; p++)
      tile_slot[j * kTileRows + p] = p < cnt ? base + (int)(key[i + p] & (kTileMaxSlots - 1)) : 0;
    j++;
  }
}

// A tile's header into shared memory (threads 0..17 of the block): its slots' activation rows (slot / xdiv) and
// output rows, its expert and count. Callers sync before (the previous tile's reads) and after.
__device__ __forceinline__ void tile_header(int tile, const int32_t* __restrict__ tile_e, const int32_t* __restrict__ tile_n,
                                            const int32_t* __restrict__ tile_slot, int xdiv, int32_t* xrow,
                                            int32_t* yrow, int32_t* expert, int32_t* count) {
  const int i = threadIdx.x;
  if (i < kTileRows) {
    const int32_t slot = tile_slot[tile * kTileRows + i];
    xrow[i] = slot / xdiv;
    yrow[i] = slot;
  } else if (i == kTileRows) {
    *expert = tile_e[tile];
  } else if (i == kTileRows + 1) {
    *count = tile_n[tile];
  }
}

// The tile kernels' loop: block y takes tiles y, y + gridDim.y, ... and runs body(expert, count, xrow, yrow) with the
// tile's header in shared memory. The caller's shared tables are loaded before the call (its first barrier covers
// them); body has no barrier. ahead(tile, nt), where given, runs on one thread (warp 1's first) while the header is
// read, with the block's next tile (tile + gridDim.y; nt: the tile count): a hint such as an L2 prefetch of its
// weights, never a value.
template <class F, class A>
__device__ __forceinline__ void over_tiles(const int32_t* __restrict__ tile_e, const int32_t* __restrict__ tile_n,
                                           const int32_t* __restrict__ tile_slot, const int32_t* __restrict__ ntiles,
                                           int xdiv, F&& body, A&& ahead) {
  __shared__ int32_t xrow[kTileRows], yrow[kTileRows];
  __shared__ int32_t tile_expert, tile_count;
  const int nt = ntiles[0];
  for (int tile = blockIdx.y; tile < nt; tile += gridDim.y) {
    __syncthreads();  // the tables are in; the previous tile's reads of the header are done
    tile_header(tile, tile_e, tile_n, tile_slot, xdiv, xrow, yrow, &tile_expert, &tile_count);
    if (threadIdx.x == 32) ahead(tile + (int)gridDim.y, nt);
    __syncthreads();
    body(tile_expert, tile_count, xrow, yrow);
  }
}
template <class F>
__device__ __forceinline__ void over_tiles(const int32_t* __restrict__ tile_e, const int32_t* __restrict__ tile_n,
                                           const int32_t* __restrict__ tile_slot, const int32_t* __restrict__ ntiles,
                                           int xdiv, F&& body) {
  over_tiles(tile_e, tile_n, tile_slot, ntiles, xdiv, body, [](int, int) {});
}

// Int8 activations: per block b, lane k's exact integer sum P over its 16 values, then L = fma(d * dx, P, L);
// with mins Lm = fma(dmin * dx, M, Lm), M = sum_v m(v) q[v] over the whole block (an integer: any order).
// The weight bytes go through shared memory kChunk blocks at a time: the 16 lanes of a row load the chunk's bytes
// together (16-bit loads, coalesced), the next chunk's loads are issued before this chunk's sums, and each lane
// decodes its values from shared memory. So a row costs one memory round trip per chunk, not one per block;
// every float operation and its order are those of the one-block-at-a-time loop.
// T > 1: the chunk's activation rows (shared by the block's rows) are staged in shared memory too, by the whole
// block in one pass. 256-value blocks per chunk: 8 for the small block types (IQ2_XXS: 528 bytes a row) up to
// T = 4, else 4 (Q4_K..Q6_K: fewer registers for the chunk in flight; T = 8, 16: the activations' shared memory).
template <int kBytes, int TT>
struct ChunkOf {
  static constexpr int value = kBytes <= 110 && TT <= 4 ? 8 : 4;
};

// kTiled (TT = kTileRows): block (x, y) takes tiles y, y + gridDim.y, ... of k_sel_tiles, W the tile's expert, its
// activation rows t = the slots' rows slot / xdiv, its output rows the slots: T = 1 products of each slot.
// full (T > 1, launched with full_stage_bytes of dynamic shared memory): all T activation rows are staged once per
// block (per tile), not per chunk, so the chunk loop has no block-wide barrier (on the H200 the 80B prompt piece's
// dense products took the same time either way: docs/BENCHMARKS.md, issue 19's eighth milestone).
template <class D, int TT, bool kTiled = false>
__global__ void __launch_bounds__(256, TT >= 8 ? 2 : 3) k_int(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows,
                                             int64_t nb, const int8_t* __restrict__ q, const float* __restrict__ dx,
                                             int T, float* __restrict__ y, int64_t ldy, const int32_t* __restrict__ sel,
                                             size_t ebytes, int xdiv, const int32_t* __restrict__ tile_e,
                                             const int32_t* __restrict__ tile_n, const int32_t* __restrict__ tile_slot,
                                             const int32_t* __restrict__ ntiles, int full) {
  if (!kTiled && !sel) prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * (blockDim.x >> 4), blockDim.x >> 4);
  pdl_wait();
  static_assert(!kTiled || TT == kTileRows, "k_int: tiles of kTileRows slots");
  if (!kTiled) {  // with sel as k_float's; without, grid row y is activation rows TT y .. TT y + TT - 1 (TT = 1: the
                  // row split, T = 1 a block; 0 in a 1-D grid)
    const int slot = blockIdx.y;
    if (sel) W += (size_t)sel[slot] * ebytes;
    const int64_t xr = sel ? slot / xdiv : (int64_t)slot * TT;
    q += xr * nb * QK_K;
    dx += xr * nb;
    y += (sel ? (int64_t)slot : xr) * ldy;
    if (!sel && TT > 1) T = T - slot * TT < TT ? T - slot * TT : TT;
  }
  extern __shared__ int4 fq[];  // full: [t][block][lane k] activation values, then the scales fd[t][block]
  const int64_t fq_n = TT > 1 && full ? (kTiled ? TT : T) * nb * 16 : 0;  // kTiled: room for a whole tile
  const float* fd = reinterpret_cast<const float*>(fq + fq_n);
  constexpr int CH = ChunkOf<D::kBytes, TT>::value;
  constexpr int kHalves = CH * D::kBytes / 2;     // 16-bit words of a full chunk of one row
  constexpr int kLoads = (kHalves + 15) / 16;     // per lane
  __shared__ IqTables tab;  // IQ2_XXS / IQ3_XXS: the grids, loaded once per thread block
  __shared__ uint16_t stage[kRowsPerBlock][kHalves];
  __shared__ int4 qs[TT > 1 ? TT * CH * 16 : 1];  // T > 1: [t][block of the chunk][lane k] activation values
  __shared__ float ds[TT > 1 ? TT * CH : 1];      // and their scales
  __shared__ int32_t xrow[kTiled ? TT : 1], yrow[kTiled ? TT : 1];  // kTiled: the tile's activation and output rows
  __shared__ int32_t tile_expert, tile_count;
  auto xr = [&](int t) -> int64_t { return kTiled ? xrow[t] : t; };
  auto yr = [&](int t) -> int64_t { return kTiled ? yrow[t] : t; };
  const int k = threadIdx.x & 15, rl = threadIdx.x >> 4, rpb = blockDim.x >> 4;
  const int64_t cols = nb * QK_K, groups = (rows + rpb - 1) / rpb;
  uint16_t u[kLoads];
  auto load = [&](int64_t g, int64_t b0) {  // chunk b0 of row group g's row rl into u
    const int64_t r = g * rpb + rl;
    const uint16_t* src = reinterpret_cast<const uint16_t*>(W + (r < rows ? r : 0) * row_bytes) + b0 * (D::kBytes / 2);
    const int64_t n = (nb - b0) * (D::kBytes / 2) < kHalves ? (nb - b0) * (D::kBytes / 2) : kHalves;
#pragma unroll
    for (int i = 0; i < kLoads; i++) {
      const int e = k + 16 * i;
      u[i] = e < n ? __ldg(src + e) : (uint16_t)0;
    }
  };
  if (!kTiled && blockIdx.x < groups) load(blockIdx.x, 0);  // the first chunk in flight while the tables load
  if constexpr (D::kTables) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      tab.iq2xxs[i] = g_iq2xxs_grid[i];
      tab.iq3xxs[i] = g_iq3xxs_grid[i];
      if (i < 128) tab.signs[i] = g_ksigns[i];
    }
    __syncthreads();
  }
  const uint8_t* const W0 = W;
  const int nt = kTiled ? ntiles[0] : 1;
  for (int tile = kTiled ? blockIdx.y : 0; tile < nt; tile += kTiled ? gridDim.y : 1) {
    if constexpr (kTiled) {
      __syncthreads();  // the previous tile's reads of xrow / yrow (and qs, ds, stage) are done
      tile_header(tile, tile_e, tile_n, tile_slot, xdiv, xrow, yrow, &tile_expert, &tile_count);
      __syncthreads();
      T = tile_count;
      W = W0 + (size_t)tile_expert * ebytes;
      if (blockIdx.x < groups) load(blockIdx.x, 0);
    }
    if (TT > 1 && full) {  // the T rows whole (kTiled: the tile's rows; the previous tile's reads are behind a barrier)
      float* fdw = reinterpret_cast<float*>(fq + fq_n);  // fd, as written here
      for (int64_t i = threadIdx.x; i < T * nb * 16; i += blockDim.x) {
        const int64_t t = i / (nb * 16), b = i / 16 % nb, kk = i % 16;
        fq[i] = __ldg(reinterpret_cast<const int4*>(q + xr((int)t) * cols + b * QK_K + 16 * kk));
      }
      for (int64_t i = threadIdx.x; i < T * nb; i += blockDim.x) fdw[i] = __ldg(dx + xr((int)(i / nb)) * nb + i % nb);
      __syncthreads();
    }
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {  // groups of rpb rows, grid-stride
      const int64_t r = g * rpb + rl;
      const bool live = r < rows;
      float L[TT], Lm[TT];
#pragma unroll
      for (int t = 0; t < TT; t++) L[t] = Lm[t] = 0.f;
      for (int64_t b0 = 0; b0 < nb; b0 += CH) {
        const int nc = nb - b0 < CH ? (int)(nb - b0) : CH;
        if (TT > 1 && !full) {  // every row of the block reads them: loaded once, by all its threads
          __syncthreads();       // the previous chunk's reads of qs / ds are done
          for (int i = threadIdx.x; i < T * nc * 16; i += blockDim.x) {
            const int t = i / (nc * 16), bb = i / 16 % nc, kk = i % 16;
            qs[(t * CH + bb) * 16 + kk] = __ldg(reinterpret_cast<const int4*>(q + xr(t) * cols + (b0 + bb) * QK_K + 16 * kk));
          }
          for (int i = threadIdx.x; i < T * nc; i += blockDim.x) ds[i / nc * CH + i % nc] = __ldg(dx + xr(i / nc) * nb + b0 + i % nc);
        }
        __syncwarp();  // the previous chunk's reads of stage are done
#pragma unroll
        for (int i = 0; i < kLoads; i++)
          if (k + 16 * i < kHalves) stage[rl][k + 16 * i] = u[i];
        if (TT > 1 && !full) __syncthreads();
        else __syncwarp();  // stage[rl] is read by its own 16 lanes alone
        if (b0 + CH < nb) load(g, b0 + CH);  // in flight while this chunk is summed (or the next group's first)
        else if (g + gridDim.x < groups) load(g + gridDim.x, 0);
        const uint8_t* sb = reinterpret_cast<const uint8_t*>(stage[rl]);
        int4 qa[TT == 1 ? CH : 1];
        float da[TT == 1 ? CH : 1];
        if constexpr (TT == 1) {  // the chunk's activations, loaded together
#pragma unroll
          for (int bb = 0; bb < CH; bb++) {
            const int64_t b = b0 + (bb < nc ? bb : 0);
            qa[bb] = __ldg(reinterpret_cast<const int4*>(q + b * QK_K + 16 * k));
            da[bb] = __ldg(dx + b);
          }
        }
#pragma unroll
        for (int bb = 0; bb < CH; bb++) {
          if (bb >= nc) break;
          const uint8_t* blk = sb + bb * D::kBytes;
          int w[16], mv[16];
          const float d = D::lane(blk, k, w, tab);
          float dmin = 0.f;
          if constexpr (D::kMins) dmin = D::mins(blk, k, mv);
#pragma unroll
          for (int t = 0; t < TT; t++) {
            if (t >= T) break;
            // the lane's 16 activation values, stored contiguously by k_quantize: one 16-byte load
            int4 q16;
            float dxb;
            if constexpr (TT == 1) {
              q16 = qa[bb];
              dxb = da[bb];
            } else if (full) {
              q16 = fq[(t * nb + b0 + bb) * 16 + k];
              dxb = fd[t * nb + b0 + bb];
            } else {
              q16 = qs[(t * CH + bb) * 16 + k];
              dxb = ds[t * CH + bb];
            }
            const int8_t* qb = reinterpret_cast<const int8_t*>(&q16);
            int P = 0, M = 0;
#pragma unroll
            for (int s = 0; s < 8; s++)
#pragma unroll
              for (int i = 0; i < 2; i++) {
                const int qv = qb[2 * s + i];
                P += w[2 * s + i] * qv;
                if constexpr (D::kMins) M += mv[2 * s + i] * qv;
              }
            L[t] = fmaf(__fmul_rn(d, dxb), (float)P, L[t]);
            if constexpr (D::kMins) {
              M += __shfl_xor_sync(0xffffffffu, M, 8, 16);
              M += __shfl_xor_sync(0xffffffffu, M, 4, 16);
              M += __shfl_xor_sync(0xffffffffu, M, 2, 16);
              M += __shfl_xor_sync(0xffffffffu, M, 1, 16);
              Lm[t] = fmaf(__fmul_rn(dmin, dxb), (float)M, Lm[t]);
            }
          }
        }
      }
#pragma unroll
      for (int t = 0; t < TT; t++) {
        if (t >= T) break;
        const float s = reduce16(L[t]);
        if (k == 0 && live) y[yr(t) * ldy + r] = __fsub_rn(s, Lm[t]);
      }
    }
  }
}

#include "kernels/cuda/kq_lanes.cuh"  // needs reduce16, prefetch_rows (above)

// Whether the IQ2_XXS products of many rows take the tensor cores (iq2_mma.cuh): the card is sm_80 or later (set
// by init_tables) and tests / benches have not turned them off (cuda_prefer_mma). The same bits either way.
bool g_mma_card = false;
bool g_mma_on = true;
bool g_iq2_panel = true;  // prompt pieces' dense IQ2_XXS products by k_iq2xxs_panel (prefer_iq2_panel: the A/B)
// ... with each warp's 16 activation rows staged in shared memory by cp.async (k_iq2xxs_panel_staged;
// prefer_iq2_panel_staged: the A/B)
bool g_iq2_panel_staged = true;
// small float matrices past 16 rows in blocks of 16 rows (prefer_row_groups): off, a block per row measured faster
bool g_row_groups = false;
// float matrices of at most this many bytes take windows of 2..kFloatSplitMaxT rows as a block per (rows, activation
// row), each the 1-row kernel, not k_float<D, TT> (prefer_float_split; 0: off): the default model's 2.2 MB Q8_0 head
// at T = 16 took 53.8 us on k_float<Q8_0, 16, 1> against 3.5 us at T = 1 (H100 profile, docs/BENCHMARKS.md session
// 26). Measured on the default model (H100, session 27): C(2) / C(1) 1.50 -> 1.32, C(4) and C(8) the same, C(16)
// 2.93 -> 3.0: so only up to 8 rows.
int64_t g_float_split_bytes = 8 << 20;
constexpr int kFloatSplitMaxT = 8;
// the int8-activation 32-value block types' small matrices (Q4_0, Q4_1, Q5_*, IQ4_NL, MXFP4 under 2 x 132 groups of
// 16 rows) take windows as a block per (rows, activation row), each the 1-row kernel, as launch_int_q's small
// matrices do, not all T rows summed in turn by 4-16 warps an SM (prefer_b32q_split; on a Q4_0 bench file C(16) /
// C(1) 4.14 -> 3.76 on the H200, docs/BENCHMARKS.md session 29)
bool g_b32q_split = true;
// Q4_K / Q5_K / Q6_K matrices under 2 x 132 groups of 16 rows (the Q4_K_M 80B's attention, DeltaNet gates and shared
// expert) over a prompt piece take k_int<D, 16> in 256-thread blocks, not the 1-row kernel per activation row, which
// re-reads the weights for every row: k_int<Q4_K, 1> took 315 of a 512-row piece's 789 ms on an H100 (docs/BENCHMARKS.md
// session 34; the 512-row piece 668 -> 868 tok/s with this, session 35). prefer_kquant_windows (default on; the same
// bits either way: every T's value is the T = 1 kernel's)
bool g_kquant_windows = true;
// the IQ2_XXS expert tiles on the tensor cores prefetch the block's rows of its next tile into L2 (prefer_tile_prefetch)
bool g_tile_prefetch = true;
// the IQ2_XXS expert tiles on the tensor cores stage each tile's activation rows in shared memory (prefer_tile_stage):
// one MoE layer of a 512-row piece of the 80B's shapes 1423 -> 1335 us (ncu, H100, docs/BENCHMARKS.md session 32)
bool g_tile_stage = true;
bool mma_available() { return g_mma_card && g_mma_on; }
int g_mma_min_t = 5;  // rows from which the dense IQ2_XXS products take k_mma<Iq2Mma> (2..4: k_iq2xxs_warp)

constexpr int kIq2U = 4;   // k_iq2xxs_warp: blocks of a row per step at T = 1 (2 for more rows: registers)

// One IQ2_XXS block's share of thread (s, l): the grid index, the sign / scale word, the scale d's bits.
struct Iq2Part {
  uint32_t idx, aux;
  uint16_t dh;
  __device__ __forceinline__ void load(const uint8_t* blk, int s, int l) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(blk + 2 + 8 * s + 4);  // even: 66-byte blocks
    idx = __ldg(blk + 2 + 8 * s + l);
    aux = (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
    dh = __ldg(reinterpret_cast<const uint16_t*>(blk));
  }
  __device__ __forceinline__ float d() const { return __fmul_rn(__half2float(__ushort_as_half(dh)), 0.125f); }
};
// Grid entry l of sub-block s decoded: its 8 values with their signs as two words of signed bytes, and the scale.
struct Iq2Vals {
  int glo, ghi, sc;
  __device__ __forceinline__ Iq2Vals() {}
  __device__ __forceinline__ Iq2Vals(const Iq2Part& w, const uint64_t* grid, const uint64_t* smask, int l) {
    const uint64_t g = grid[w.idx], mk = smask[(w.aux >> (7 * l)) & 127];
    const uint32_t mlo = (uint32_t)mk, mhi = (uint32_t)(mk >> 32);
    // -g bytewise as (g ^ 0xff) + 1: no carry between bytes (grid values are 8..43)
    glo = (int)(((uint32_t)g ^ mlo) + (mlo & 0x01010101u));
    ghi = (int)(((uint32_t)(g >> 32) ^ mhi) + (mhi & 0x01010101u));
    sc = 2 * (int)(w.aux >> 28) + 1;
  }
  // lane k = 4 l + 2 hi4 + hi3's integer sum over the block (k_int's P), summed over the warp's 8 sub-blocks;
  // act: the 4 value pairs of thread (s, l) (16-bit words)
  __device__ __forceinline__ int lane_sum(const uint32_t* act, bool hi4, bool hi3) const {
    const int p0 = sc * __dp4a(glo, (int)act[0], 0), p1 = sc * __dp4a(glo, (int)(act[1] << 16), 0);
    const int p2 = sc * __dp4a(ghi, (int)act[2], 0), p3 = sc * __dp4a(ghi, (int)(act[3] << 16), 0);
    // the sum over s (bits 2..4 of the thread), keeping pair m = 2 hi4 + hi3
    const int a0 = (hi4 ? p2 : p0) + __shfl_xor_sync(0xffffffffu, hi4 ? p0 : p2, 16);
    const int a1 = (hi4 ? p3 : p1) + __shfl_xor_sync(0xffffffffu, hi4 ? p1 : p3, 16);
    const int c = (hi3 ? a1 : a0) + __shfl_xor_sync(0xffffffffu, hi3 ? a0 : a1, 8);
    return c + __shfl_xor_sync(0xffffffffu, c, 4);
  }
};

// The IQ2_XXS warp kernels' shared tables, loaded by the whole block (the caller syncs before reading them): the
// grid, and g_ksigns[i] as byte masks (byte e = 0xff where bit e is set: negative).
__device__ __forceinline__ void iq2_tables(uint64_t* grid, uint64_t* smask) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    grid[i] = g_iq2xxs_grid[i];
    if (i < 128) {
      const uint32_t sg = g_ksigns[i];
      uint64_t mk = 0;
      for (int e = 0; e < 8; e++)
        if ((sg >> e) & 1) mk |= (uint64_t)0xff << (8 * e);
      smask[i] = mk;
    }
  }
}

// reduce16's tree over the warp's lanes: lane k + 8 is thread t ^ 2, k + 4 is t ^ 1, k + 2 is t ^ 16, k + 1 is
// t ^ 8 (a + b == b + a bit for bit); thread 0 (lane 0) gets the sum.
__device__ __forceinline__ float reduce16_iq2(float L) {
  L = __fadd_rn(L, __shfl_xor_sync(0xffffffffu, L, 2));
  L = __fadd_rn(L, __shfl_xor_sync(0xffffffffu, L, 1));
  L = __fadd_rn(L, __shfl_xor_sync(0xffffffffu, L, 16));
  return __fadd_rn(L, __shfl_xor_sync(0xffffffffu, L, 8));
}

// IQ2_XXS products of 2..4 activation rows, a warp per weight row (T = 1: k_iq2xxs_warp1 below; k_int's 16 lanes per row re-decode each grid entry for 2 of its 8
// values and were instruction-bound: ~115 warp instructions per 66-byte block). Thread t = 4 s + l of the warp
// decodes the 8 values of grid entry l of sub-block s once, with the IQ signs applied bytewise and 4 dp4a's giving
// the 4 value pairs (2 k, 2 k + 1) of matmul.h's lanes k = 4 l + m, m = 0..3. Lane k's integer sum over the
// block, P_k = sum over s of (2 sc_s + 1) * pair, is the same integer as k_int's (integer sums: any order),
// gathered over the 8 sub-blocks by shuffles; then L_k = fma(d * dx, P_k, L_k) over the blocks in order and
// reduce16's tree over the lanes, as k_int: the same float operations in the same order, so the same bits, for
// every activation row the warp takes.
// Activations: k_quantize's lane-major layout, value 32 s + 2 k + i at 16 k + 2 s + i: pair m of thread (s, l)
// is the 16-bit word at 64 l + 16 m + 2 s. Blocks are taken kU at a time, their weight loads issued together.
// Activation rows 0..T-1 of q (T <= TT), each into its own row of y (windows of 2..4 dense rows; the experts'
// products at T = 1 and per slot are k_iq2xxs_warp1's). 256 threads = 8 warps; each warp takes rpw consecutive
// weight rows.
template <int kU, int TT>
__global__ void __launch_bounds__(256) k_iq2xxs_warp(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows,
                                                     int64_t nb, const int8_t* __restrict__ q,
                                                     const float* __restrict__ dx, float* __restrict__ y, int64_t ldy,
                                                     int T, int rpw) {
  prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * (blockDim.x >> 5) * rpw, (blockDim.x >> 5) * rpw);
  pdl_wait();
  __shared__ uint64_t grid[256];
  __shared__ uint64_t smask[128];  // g_ksigns[i] as byte masks: byte e = 0xff where bit e is set (negative)
  const int t = threadIdx.x & 31, s = t >> 2, l = t & 3;
  const bool hi4 = (t >> 4) & 1, hi3 = (t >> 3) & 1;
  const int64_t cols = nb * QK_K;
  const int64_t rfirst = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * rpw;
  Iq2Part w[kU];
  const uint8_t* row = nullptr;
  auto load = [&](int64_t b0) {
#pragma unroll
    for (int u = 0; u < kU; u++) {
      const int64_t b = b0 + u < nb ? b0 + u : nb - 1;
      w[u].load(row + b * IQ2_XXS::kBytes, s, l);
    }
  };
  auto set_row = [&](int64_t r) { row = W + (r < rows ? r : rows - 1) * row_bytes; };
  set_row(rfirst);
  load(0);  // in flight while the tables load
  iq2_tables(grid, smask);
  __syncthreads();
  for (int64_t r = rfirst; r < rfirst + rpw && r < rows; r++) {
    if (r != rfirst) {
      set_row(r);
      load(0);
    }
    float L[TT];  // lane k = 4 l + 2 hi4 + hi3 (held twice: t and t ^ 4)
#pragma unroll
    for (int j = 0; j < TT; j++) L[j] = 0.f;
    for (int64_t b0 = 0; b0 < nb; b0 += kU) {
      Iq2Vals v[kU];
      float d[kU];
#pragma unroll
      for (int u = 0; u < kU; u++) {
        v[u] = Iq2Vals(w[u], grid, smask, l);
        d[u] = w[u].d();
      }
#pragma unroll
      for (int j = 0; j < TT; j++) {
        if (j >= T) break;
        uint32_t act[kU][4];
        float dxb[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
          const int64_t b = b0 + u < nb ? b0 + u : nb - 1;
          const uint16_t* qa = reinterpret_cast<const uint16_t*>(q + j * cols + b * QK_K + 64 * l + 2 * s);
#pragma unroll
          for (int m = 0; m < 4; m++) act[u][m] = __ldg(qa + 8 * m);
          dxb[u] = __ldg(dx + j * nb + b);
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
          const int P = v[u].lane_sum(act[u], hi4, hi3);
          if (b0 + u < nb) L[j] = fmaf(__fmul_rn(d[u], dxb[u]), (float)P, L[j]);
        }
      }
      if (b0 + kU < nb) load(b0 + kU);  // in flight while the chain's last fmas and the next decode wait
    }
#pragma unroll
    for (int j = 0; j < TT; j++) {
      if (j >= T) break;
      const float g = __fsub_rn(reduce16_iq2(L[j]), 0.f);  // k_int's y = s - Lm, Lm = 0
      if (t == 0) y[(int64_t)j * ldy + r] = g;
    }
  }
}

// One IQ2_XXS block's share of thread (s, l): the grid index, the sign / scale word, the scale d's bits.
struct Iq2Part1 {
  uint32_t idx, aux;
  uint16_t dh;
  __device__ __forceinline__ void load(const uint8_t* blk, int s, int l) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(blk + 2 + 8 * s + 4);  // even: 66-byte blocks
    idx = __ldg(blk + 2 + 8 * s + l);
    aux = (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
    dh = __ldg(reinterpret_cast<const uint16_t*>(blk));
  }
  // lane k = 4 l + 2 hi4 + hi3's integer sum over the block (k_int's P), summed over the warp's 8 sub-blocks
  __device__ __forceinline__ int lane_sum(const uint64_t* grid, const uint64_t* smask, const uint32_t* act, int l,
                                          bool hi4, bool hi3) const {
    const uint64_t g = grid[idx], mk = smask[(aux >> (7 * l)) & 127];
    const uint32_t mlo = (uint32_t)mk, mhi = (uint32_t)(mk >> 32);
    // -g bytewise as (g ^ 0xff) + 1: no carry between bytes (grid values are 8..43)
    const int glo = (int)(((uint32_t)g ^ mlo) + (mlo & 0x01010101u));
    const int ghi = (int)(((uint32_t)(g >> 32) ^ mhi) + (mhi & 0x01010101u));
    const int sc = 2 * (int)(aux >> 28) + 1;
    const int p0 = sc * __dp4a(glo, (int)act[0], 0), p1 = sc * __dp4a(glo, (int)(act[1] << 16), 0);
    const int p2 = sc * __dp4a(ghi, (int)act[2], 0), p3 = sc * __dp4a(ghi, (int)(act[3] << 16), 0);
    // the sum over s (bits 2..4 of the thread), keeping pair m = 2 hi4 + hi3
    const int a0 = (hi4 ? p2 : p0) + __shfl_xor_sync(0xffffffffu, hi4 ? p0 : p2, 16);
    const int a1 = (hi4 ? p3 : p1) + __shfl_xor_sync(0xffffffffu, hi4 ? p1 : p3, 16);
    const int c = (hi3 ? a1 : a0) + __shfl_xor_sync(0xffffffffu, hi3 ? a0 : a1, 8);
    return c + __shfl_xor_sync(0xffffffffu, c, 4);
  }
  __device__ __forceinline__ float d() const { return __fmul_rn(__half2float(__ushort_as_half(dh)), 0.125f); }
};

// IQ2_XXS at T = 1, a warp per weight row (k_int's 16 lanes per row re-decode each grid entry for 2 of its 8
// values and were instruction-bound: ~115 warp instructions per 66-byte block). Thread t = 4 s + l of the warp
// decodes the 8 values of grid entry l of sub-block s once, with the IQ signs applied bytewise and 4 dp4a's giving
// the 4 value pairs (2 k, 2 k + 1) of matmul.h's lanes k = 4 l + m, m = 0..3. Lane k's integer sum over the
// block, P_k = sum over s of (2 sc_s + 1) * pair, is the same integer as k_int's (integer sums: any order),
// gathered over the 8 sub-blocks by shuffles; then L_k = fma(d * dx, P_k, L_k) over the blocks in order and
// reduce16's tree over the lanes, as k_int: the same float operations in the same order, so the same bits.
// Activations: k_quantize's lane-major layout, value 32 s + 2 k + i at 16 k + 2 s + i: pair m of thread (s, l)
// is the 16-bit word at 64 l + 16 m + 2 s. Blocks are taken kU at a time, their loads issued together.
// sel as k_int's (blockIdx.y = slot; without sel, blockIdx.y = activation row: the row split). 256 threads = 8 warps;
// warp w takes the R consecutive weight rows R (8 x + w) + i, i < R, their kU blocks' loads in flight together and
// the tables loaded once for the block's 8 R rows (a table fill is 3 KB from L2; an expert's down product, 512
// columns, is 132 bytes of weights a row). Each row's operations and their order do not depend on R or kU.
// kPair (matmul_sel_swiglu): the warp also takes row r of W2 (the up matrix, same shape) over the same activation
// loads, writes it to y2 and silu(y) * y2 to y: layers.cu's silu_mul, the same operations.
template <int kU, bool kPair, int R>
__global__ void __launch_bounds__(256) k_iq2xxs_warp1(const uint8_t* __restrict__ W, const uint8_t* __restrict__ W2,
                                                     size_t row_bytes, int64_t rows, int64_t nb,
                                                     const int8_t* __restrict__ q, const float* __restrict__ dx,
                                                     float* __restrict__ y, float* __restrict__ y2, int64_t ldy,
                                                     const int32_t* __restrict__ sel, size_t ebytes, size_t ebytes2,
                                                     int xdiv) {
  if (!sel) prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * (blockDim.x >> 5) * R, (blockDim.x >> 5) * R);
  pdl_wait();
  {  // with sel, grid row y is slot y; without, activation row y (the row split; 0 in a 1-D grid)
    const int slot = blockIdx.y;
    if (sel) {
      W += (size_t)sel[slot] * ebytes;
      if constexpr (kPair) W2 += (size_t)sel[slot] * ebytes2;
    }
    q += (int64_t)(slot / xdiv) * nb * QK_K;
    dx += (int64_t)(slot / xdiv) * nb;
    y += (int64_t)slot * ldy;
    if constexpr (kPair) y2 += (int64_t)slot * ldy;
  }
  __shared__ uint64_t grid[256];
  __shared__ uint64_t smask[128];  // g_ksigns[i] as byte masks: byte e = 0xff where bit e is set (negative)
  const int t = threadIdx.x & 31, s = t >> 2, l = t & 3;
  const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  const uint8_t* row[R];
  const uint8_t* row2[R];
#pragma unroll
  for (int i = 0; i < R; i++) {
    const int64_t r = r0 + i < rows ? r0 + i : rows - 1;
    row[i] = W + r * row_bytes;
    row2[i] = kPair ? W2 + r * row_bytes : nullptr;
  }
  Iq2Part1 w[R][kU], w2[kPair ? R : 1][kPair ? kU : 1];
  uint32_t act[kU][4];
  float dxb[kU];
  auto load = [&](int64_t b0) {
#pragma unroll
    for (int u = 0; u < kU; u++) {
      const int64_t b = b0 + u < nb ? b0 + u : nb - 1;
#pragma unroll
      for (int i = 0; i < R; i++) {
        w[i][u].load(row[i] + b * IQ2_XXS::kBytes, s, l);
        if constexpr (kPair) w2[i][u].load(row2[i] + b * IQ2_XXS::kBytes, s, l);
      }
      const uint16_t* qa = reinterpret_cast<const uint16_t*>(q + b * QK_K + 64 * l + 2 * s);
#pragma unroll
      for (int m = 0; m < 4; m++) act[u][m] = __ldg(qa + 8 * m);
      dxb[u] = __ldg(dx + b);
    }
  };
  load(0);  // in flight while the tables load
  iq2_tables(grid, smask);
  __syncthreads();
  const bool hi4 = (t >> 4) & 1, hi3 = (t >> 3) & 1;
  float L[R], L2[R];  // row i's lane k = 4 l + 2 hi4 + hi3 (held twice: t and t ^ 4)
#pragma unroll
  for (int i = 0; i < R; i++) L[i] = L2[i] = 0.f;
  for (int64_t b0 = 0; b0 < nb; b0 += kU) {
    int P[R][kU], P2[kPair ? R : 1][kPair ? kU : 1];
    float dd[R][kU], dd2[kPair ? R : 1][kPair ? kU : 1];
#pragma unroll
    for (int u = 0; u < kU; u++)
#pragma unroll
      for (int i = 0; i < R; i++) {
        P[i][u] = w[i][u].lane_sum(grid, smask, act[u], l, hi4, hi3);
        dd[i][u] = __fmul_rn(w[i][u].d(), dxb[u]);
        if constexpr (kPair) {
          P2[i][u] = w2[i][u].lane_sum(grid, smask, act[u], l, hi4, hi3);
          dd2[i][u] = __fmul_rn(w2[i][u].d(), dxb[u]);
        }
      }
    if (b0 + kU < nb) load(b0 + kU);
#pragma unroll
    for (int u = 0; u < kU; u++)
      if (b0 + u < nb) {
#pragma unroll
        for (int i = 0; i < R; i++) {
          L[i] = fmaf(dd[i][u], (float)P[i][u], L[i]);
          if constexpr (kPair) L2[i] = fmaf(dd2[i][u], (float)P2[i][u], L2[i]);
        }
      }
  }
#pragma unroll
  for (int i = 0; i < R; i++) {
    const float Li = reduce16_iq2(L[i]);
    const float L2i = kPair ? reduce16_iq2(L2[i]) : 0.f;
    const int64_t r = r0 + i;
    if (t == 0 && r < rows) {
      const float g = __fsub_rn(Li, 0.f);  // k_int's y = s - Lm, Lm = 0
      if constexpr (kPair) {
        const float up = __fsub_rn(L2i, 0.f);
        y2[r] = up;
        y[r] = __fmul_rn(silu_of(g), up);
      } else {
        y[r] = g;
      }
    }
  }
}

int g_iq2_rows_dense = 1, g_iq2_rows_sel = 4, g_iq2_rows_pair = 1;  // prefer_iq2_rows (pair: 1 measured +3 % against 2, twice)
bool g_iq2_window_u4 = false;  // prefer_iq2_window_u4: k_iq2xxs_warp (dense windows of 2..4 rows) 4 blocks a step

// k_iq2xxs_warp1 over n grid rows (slots with sel, else activation rows), R weight rows a warp: R = the dense
// products', the experts' or the experts' gate / up pairs' (prefer_iq2_rows); kU = 2 blocks a step where a row has at most 2 (the experts' and the shared expert's
// down products: 512 columns) or R = 4 (16 loads in flight with kPair), else 4.
template <bool kPair>
void launch_iq2_warp1(const MatView& W, const uint8_t* W2, size_t eb, size_t eb2, const int32_t* sel, int n, int xdiv,
                      const int8_t* q, const float* dx, float* y, float* y2, int64_t ldy, cudaStream_t st) {
  const int64_t nb = W.cols / QK_K;
  const int R = !sel ? g_iq2_rows_dense : kPair ? g_iq2_rows_pair : g_iq2_rows_sel;
  auto go = [&](auto kern, int r) {
    launch(kern, dim3((unsigned)((W.rows + 8 * r - 1) / (8 * r)), (unsigned)n), 256, 0, st, W.data, W2, W.row_bytes,
           W.rows, nb, q, dx, y, y2, ldy, sel, eb, eb2, xdiv);
  };
  const bool two = nb <= 2;
  if (R == 4) go(k_iq2xxs_warp1<2, kPair, 4>, 4);
  else if (R == 2) two ? go(k_iq2xxs_warp1<2, kPair, 2>, 2) : go(k_iq2xxs_warp1<kIq2U, kPair, 2>, 2);
  else two ? go(k_iq2xxs_warp1<2, kPair, 1>, 1) : go(k_iq2xxs_warp1<kIq2U, kPair, 1>, 1);
}

// IQ2_XXS expert products over tiles (k_sel_tiles): block (x, y) takes tiles y, y + gridDim.y, ...; its warps take
// R weight rows at a time (r0 = R (8 x + warp), then + 8 R gridDim.x) of the tile's expert, loading the R rows' next
// kU blocks together (R kU = 8 blocks, 16 with kPair: their loads in flight together). Each
// block is decoded once (Iq2Vals, as k_iq2xxs_warp) and summed against each of the tile's slots (activation row
// slot / xdiv): lane_sum, L = fma(d * dx, P, L) over the blocks in order, reduce16_iq2, as k_iq2xxs_warp1 for that
// slot alone, so the same bits. kPair: gate and up as k_iq2xxs_warp1's kPair (y2 = up, y = silu(gate) * up).
template <bool kPair, int R, int kU>
__global__ void __launch_bounds__(256, 2) k_iq2xxs_tiles(const uint8_t* __restrict__ W, const uint8_t* __restrict__ W2,
                                                        size_t row_bytes, int64_t rows, int64_t nb,
                                                        const int8_t* __restrict__ q, const float* __restrict__ dx,
                                                        float* __restrict__ y, float* __restrict__ y2, int64_t ldy,
                                                        size_t ebytes, size_t ebytes2, int xdiv,
                                                        const int32_t* __restrict__ tile_e,
                                                        const int32_t* __restrict__ tile_n,
                                                        const int32_t* __restrict__ tile_slot,
                                                        const int32_t* __restrict__ ntiles) {
  pdl_wait();
  __shared__ uint64_t grid[256];
  __shared__ uint64_t smask[128];  // as k_iq2xxs_warp1's
  iq2_tables(grid, smask);
  const int t = threadIdx.x & 31, s = t >> 2, l = t & 3;
  const bool hi4 = (t >> 4) & 1, hi3 = (t >> 3) & 1;
  const int64_t cols = nb * QK_K;
  const int64_t r_first = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  const int64_t r_step = (int64_t)gridDim.x * (blockDim.x >> 5) * R;
  over_tiles(tile_e, tile_n, tile_slot, ntiles, xdiv, [&](int tile_expert, int cnt, const int32_t* xrow,
                                                          const int32_t* yrow) {
    const uint8_t* We = W + (size_t)tile_expert * ebytes;
    const uint8_t* We2 = kPair ? W2 + (size_t)tile_expert * ebytes2 : nullptr;
    for (int64_t r0 = r_first; r0 < rows; r0 += r_step) {
      float L[R][kTileRows], L2[kPair ? R : 1][kPair ? kTileRows : 1];
#pragma unroll
      for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < kTileRows; j++) L[i][j] = 0.f;
      if constexpr (kPair)
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
          for (int j = 0; j < kTileRows; j++) L2[i][j] = 0.f;
      for (int64_t b0 = 0; b0 < nb; b0 += kU) {
        Iq2Part p[R][kU], p2[kPair ? R : 1][kPair ? kU : 1];
#pragma unroll
        for (int i = 0; i < R; i++) {
          const int64_t r = r0 + i < rows ? r0 + i : rows - 1;
#pragma unroll
          for (int u = 0; u < kU; u++) {
            const int64_t b = b0 + u < nb ? b0 + u : nb - 1;
            p[i][u].load(We + r * row_bytes + b * IQ2_XXS::kBytes, s, l);
            if constexpr (kPair) p2[i][u].load(We2 + r * row_bytes + b * IQ2_XXS::kBytes, s, l);
          }
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
          if (b0 + u >= nb) break;
          Iq2Vals v[R], v2[kPair ? R : 1];
          float d[R], d2[kPair ? R : 1];
#pragma unroll
          for (int i = 0; i < R; i++) {
            v[i] = Iq2Vals(p[i][u], grid, smask, l);
            d[i] = p[i][u].d();
            if constexpr (kPair) {
              v2[i] = Iq2Vals(p2[i][u], grid, smask, l);
              d2[i] = p2[i][u].d();
            }
          }
#pragma unroll
          for (int j = 0; j < kTileRows; j++) {
            if (j >= cnt) break;
            const uint16_t* qa = reinterpret_cast<const uint16_t*>(q + (int64_t)xrow[j] * cols + (b0 + u) * QK_K + 64 * l + 2 * s);
            uint32_t act[4];
#pragma unroll
            for (int mm = 0; mm < 4; mm++) act[mm] = __ldg(qa + 8 * mm);
            const float dxb = __ldg(dx + (int64_t)xrow[j] * nb + b0 + u);
#pragma unroll
            for (int i = 0; i < R; i++) {
              L[i][j] = fmaf(__fmul_rn(d[i], dxb), (float)v[i].lane_sum(act, hi4, hi3), L[i][j]);
              if constexpr (kPair) L2[i][j] = fmaf(__fmul_rn(d2[i], dxb), (float)v2[i].lane_sum(act, hi4, hi3), L2[i][j]);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < R; i++) {
        const int64_t r = r0 + i;
#pragma unroll
        for (int j = 0; j < kTileRows; j++) {
          if (j >= cnt) break;
          const float g = __fsub_rn(reduce16_iq2(L[i][j]), 0.f);  // k_int's y = s - Lm, Lm = 0
          if constexpr (kPair) {
            const float up = __fsub_rn(reduce16_iq2(L2[i][j]), 0.f);
            if (t == 0 && r < rows) {
              y2[(int64_t)yrow[j] * ldy + r] = up;
              y[(int64_t)yrow[j] * ldy + r] = __fmul_rn(silu_of(g), up);
            }
          } else if (t == 0 && r < rows) {
            y[(int64_t)yrow[j] * ldy + r] = g;
          }
        }
      }
    }
  });
}

#include "kernels/cuda/mma.cuh"      // needs over_tiles, prefetch_rows, tree16 (above)
#include "kernels/cuda/iq2_mma.cuh"  // needs iq2_tables (above), mma.cuh
#include "kernels/cuda/kq_mma.cuh"   // needs mma.cuh, mma_available (above)

// The card's limit on the shared memory a block may opt in to (init_tables: 227 KB on the H100 / H200, 163 KB on the
// A100, 99 KB on sm_86 / 89 / 120 cards), and the dynamic shared memory each staging kernel was allowed under it
// (allow_dyn_smem): a staging kernel is launched only where its bytes fit that, else its unstaged form is.
size_t g_smem_optin = 48 * 1024;
size_t g_panel_smem_max = kPanelMaxSmem, g_panel_staged_smem_max = kPanelStagedMaxSmem;
size_t g_tile_stage_max = kTileStageMax;
// Allows kern up to `want` bytes of dynamic shared memory, or what the card leaves beside its static shared memory
// if that is less; returns the bytes allowed.
template <class K>
size_t allow_dyn_smem(K kern, size_t want, const char* what) {
  cudaFuncAttributes fa{};
  check(cudaFuncGetAttributes(&fa, kern), what);
  const size_t room = g_smem_optin > fa.sharedSizeBytes ? g_smem_optin - fa.sharedSizeBytes : 0;
  const size_t cap = std::min(want, room);
  check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap), what);
  return cap;
}

// Scratch of the tiles after the activations: tile_e, tile_n (kTileMaxSlots each), tile_slot (kTileRows a tile), the
// tile count.
constexpr size_t kTileScratch = ((2 + kTileRows) * kTileMaxSlots + 4) * sizeof(int32_t);
size_t tile_offset(size_t act) { return (act + 15) / 16 * 16; }
struct TileBufs {
  int32_t *e, *n, *slot, *count;
  explicit TileBufs(int32_t* ts)
      : e(ts), n(ts + kTileMaxSlots), slot(ts + 2 * kTileMaxSlots), count(ts + (2 + kTileRows) * kTileMaxSlots) {}
  // matmul_sel's scratch: act_bytes of the quantized rows, then the tiles (matmul_sel_scratch_bytes)
  TileBufs(void* scratch, size_t act) : TileBufs(reinterpret_cast<int32_t*>(static_cast<uint8_t*>(scratch) + tile_offset(act))) {}
};
bool use_tiles(int n, int xdiv) { return n >= kTileMinSlots && xdiv <= kTileMaxSlots; }
// For each piece [off, off + m) of at most kTileMaxSlots slots (whole activation rows): k_sel_tiles, then products(gy),
// the products over that piece's tiles with gy = min(m, kTileBlocksY) blocks in y. In stream order: a piece's tiles
// are read before the next piece's are made.
template <class F>
void over_tile_pieces(const int32_t* sel, int n, int xdiv, const TileBufs& tb, cudaStream_t st, F&& products) {
  const int piece = kTileMaxSlots - kTileMaxSlots % xdiv;
  for (int off = 0; off < n; off += piece) {
    const int m = std::min(piece, n - off);
    launch(k_sel_tiles, 1, kSelThreads, 0, st, sel, off, m, tb.e, tb.n, tb.slot, tb.count);
    products(std::min(m, kTileBlocksY));
  }
}

// The products over one piece's expert tiles (gy blocks in y) on the tensor cores, MMA source S (mma.cuh
// k_tiles_mma): a warp per 16 weight rows of the tile's expert; kPair: W2 (up) beside W (gate), then SwiGLU.
template <class S, bool kPair>
void launch_tiles_mma(const MatView& W, const uint8_t* W2, size_t eb, size_t eb2, int xdiv, const int8_t* q,
                      const float* dx, float* y, float* y2, int64_t ldy, const TileBufs& tb, int gy, cudaStream_t st) {
  const int64_t nb = W.cols / QK_K, g16 = (W.rows + 15) / 16;
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>((g16 + kMmaWarps - 1) / kMmaWarps, (2048 + gy - 1) / gy));
  const dim3 grid((unsigned)gx, (unsigned)gy);
  auto go = [&](auto kern, size_t smem) {
    launch(kern, grid, 32 * kMmaWarps, smem, st, W.data, W2, W.row_bytes, W.rows, nb, q, dx, y, y2, ldy, eb, eb2, xdiv,
           tb.e, tb.n, tb.slot, tb.count, g_tile_prefetch);
  };
  if (g_tile_stage && tile_stage_bytes(2, nb) <= g_tile_stage_max) {  // the activations staged a tile
    go(k_tiles_mma<S, 1, kPair, true>, tile_stage_bytes(1, nb));
    go(k_tiles_mma<S, 2, kPair, true>, tile_stage_bytes(2, nb));
  } else {
    go(k_tiles_mma<S, 1, kPair, false>, 0);
    go(k_tiles_mma<S, 2, kPair, false>, 0);
  }
}

// Expert products of n slots over IQ2_XXS (kPair: gate and up, then SwiGLU): a warp per (slot, weight row), or
// from kTileMinSlots slots on over tiles (tb: the tile scratch), in pieces of at most kTileMaxSlots whole rows.
template <bool kPair>
void launch_iq2_sel(const MatView& W, const uint8_t* W2, size_t eb, size_t eb2, const int32_t* sel, int n, int xdiv,
                    const int8_t* q, const float* dx, float* y, float* y2, int64_t ldy, const TileBufs& tb,
                    cudaStream_t st) {
  const int64_t nb = W.cols / QK_K;
  if (!use_tiles(n, xdiv)) {
    launch_iq2_warp1<kPair>(W, W2, eb, eb2, sel, n, xdiv, q, dx, y, y2, ldy, st);
    return;
  }
  over_tile_pieces(sel, n, xdiv, tb, st, [&](int gy) {
    if (mma_available()) {  // the tensor cores (mma.cuh): a warp per 16 weight rows of the tile's expert
      launch_tiles_mma<Iq2Mma, kPair>(W, W2, eb, eb2, xdiv, q, dx, y, y2, ldy, tb, gy, st);
      return;
    }
    auto go = [&](auto kern, int R) {  // ~2048 blocks in all (8 an SM), at most a warp per R weight rows
      const int64_t gx = std::max<int64_t>(1, std::min<int64_t>((W.rows + 8 * R - 1) / (8 * R), (2048 + gy - 1) / gy));
      launch(kern, dim3((unsigned)gx, (unsigned)gy), 256, 0, st, W.data, W2, W.row_bytes, W.rows, nb, q, dx, y, y2, ldy,
             eb, eb2, xdiv, tb.e, tb.n, tb.slot, tb.count);
    };
    // the experts' gate / up (2048 columns: 8 blocks a row): a row's 8 blocks at once; the down product (512
    // columns: 2 blocks) 4 rows at once
    if constexpr (kPair) go(k_iq2xxs_tiles<true, 1, 8>, 1);
    else if (nb >= 8) go(k_iq2xxs_tiles<false, 1, 8>, 1);
    else go(k_iq2xxs_tiles<false, 4, 2>, 4);
  });
}

// quantize_act_ref on the card, a 256-value block xb by one warp (lane l holding values l + 32 j): amax = max |x| from
// 0 (a max: any order), iscale = 127 / amax, q = round-half-even(iscale * x), dx = amax / 127 (IEEE division, as on
// the CPU). Stored lane-major: value v = 32 s + 2 k + i of the block at 16 k + 2 s + i, so that lane k of k_int
// reads its 16 values with one 16-byte load.
__device__ __forceinline__ void quantize_q8_256_warp(const float* xb, int8_t* __restrict__ qb, float* __restrict__ dxb) {
  const int lane = threadIdx.x & 31;
  float v[8];
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    v[j] = xb[lane + 32 * j];
    a = fmaxf(a, fabsf(v[j]));
  }
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float iscale = a > 0.f ? __fdiv_rn(127.f, a) : 0.f;
#pragma unroll
  for (int j = 0; j < 8; j++)  // value vi = lane + 32 j at 16 (vi % 32 / 2) + 2 (vi / 32) + vi % 2
    qb[16 * (lane / 2) + 2 * j + lane % 2] = (int8_t)rintf(__fmul_rn(iscale, v[j]));
  if (lane == 0) *dxb = __fdiv_rn(a, 127.f);
}

// x's rows quantized: a warp per (row t, block b), 8 blocks per thread block (a block of 256 threads per 256 values
// was 15 ms of a 512-row piece of the 80B file: ~900 000 tiny blocks).
__global__ void __launch_bounds__(256) k_quantize(const float* __restrict__ x, int64_t ldx, int64_t nb,
                                                  int8_t* __restrict__ q, float* __restrict__ dx) {
  pdl_wait();
  const int t = blockIdx.y;
  const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (b >= nb) return;  // whole warps
  quantize_q8_256_warp(x + t * ldx + b * QK_K, q + t * nb * QK_K + b * QK_K, dx + t * nb + b);
}

// quantize_act32_ref on the card (act32.h): a warp per (row t, 32-value block b), 8 blocks per thread block;
// the same formulas as k_quantize. Stored plainly: q[t * cols + c], dx[t * nb + b].
__global__ void __launch_bounds__(256) k_quantize32(const float* __restrict__ x, int64_t ldx, int64_t nb,
                                                    int8_t* __restrict__ q, float* __restrict__ dx) {
  pdl_wait();
  const int t = blockIdx.y;
  const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (b >= nb) return;  // whole warps
  const int i = threadIdx.x & 31;
  const float v = x[t * ldx + b * 32 + i];
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float iscale = amax > kAct32Tiny ? __fdiv_rn(127.f, amax) : 0.f;
  q[t * nb * 32 + b * 32 + i] = (int8_t)rintf(__fmul_rn(iscale, v));
  if (i == 0) dx[t * nb + b] = __fdiv_rn(amax, 127.f);
}

// The 32-value block types with int8 activations (matmul.h, rows_b32q_ref's order): 16 threads per weight row,
// thread j = 4 h + i holds lane j: the blocks b = h, h + 4, ... in increasing order, and of each the values 4i..4i+3
// and 16+4i..16+4i+3: P = two dp4a (exact), L = fma(s * dx, P, L) (Q4_1 / Q5_1: then fma(m * dx, S, L), S the
// lane's sum of q); then reduce16's tree. Expert selection as k_float's.
template <class D, int TT>
__global__ void __launch_bounds__(256) k_b32q(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows,
                                              int64_t nb, const int8_t* __restrict__ q, const float* __restrict__ dx,
                                              int T, float* __restrict__ y, int64_t ldy, const int32_t* __restrict__ sel,
                                              size_t ebytes, int xdiv) {
  if (!sel) prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * (blockDim.x >> 4), blockDim.x >> 4);
  pdl_wait();
  {  // with sel as k_float's; without, grid row y is activation rows TT y .. TT y + TT - 1 (TT = 1: the row split,
     // T = 1 a block; 0 in a 1-D grid)
    const int slot = blockIdx.y;
    if (sel) W += (size_t)sel[slot] * ebytes;
    const int64_t xr = sel ? slot / xdiv : (int64_t)slot * TT;
    q += xr * nb * 32;
    dx += xr * nb;
    y += (sel ? (int64_t)slot : xr) * ldy;
    if (!sel && TT > 1) T = T - slot * TT < TT ? T - slot * TT : TT;
  }
  const int j = threadIdx.x & 15, h = j >> 2, i = j & 3;
  const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  const uint8_t* row = W + (r < rows ? r : 0) * row_bytes;  // all threads shuffle
  float L[TT];
#pragma unroll
  for (int t = 0; t < TT; t++) L[t] = 0.f;
  for (int64_t b = h; b < nb; b += 4) {
    const uint8_t* blk = row + b * D::kSize;
    const int wlo = D::vals4(blk, i), whi = D::vals4(blk, i + 4);
    const float s = D::scale(blk), m = D::min(blk);
#pragma unroll
    for (int t = 0; t < TT; t++)
      if (t < T) {
        const int8_t* qb = q + t * nb * 32 + b * 32;
        const int qlo = __ldg(reinterpret_cast<const int*>(qb + 4 * i)), qhi = __ldg(reinterpret_cast<const int*>(qb + 16 + 4 * i));
        const float dxb = __ldg(dx + t * nb + b);
        L[t] = fmaf(__fmul_rn(s, dxb), (float)__dp4a(whi, qhi, __dp4a(wlo, qlo, 0)), L[t]);
        if constexpr (D::kMin)  // the min term: m * dx times the lane's sum of q
          L[t] = fmaf(__fmul_rn(m, dxb), (float)__dp4a(0x01010101, qhi, __dp4a(0x01010101, qlo, 0)), L[t]);
      }
  }
#pragma unroll
  for (int t = 0; t < TT; t++) {
    if (t >= T) break;
    const float v = reduce16(L[t]);
    if (j == 0 && r < rows) y[t * ldy + r] = v;
  }
}

// ops.h rmsnorm: dot16's 16 lanes (l[j] += x*x over i = j mod 16, increasing i, no FMA) and its tree, then
// r = 1 / sqrt(ss / n + eps), y = (x * r) * w. One block of 256 per row: the row is staged in shared memory in one
// coalesced pass (n <= kNormStage; longer rows read it from memory), lanes 0..15 of warp 0 hold the 16 sums.
constexpr int kNormStage = 8192;

// The norms' output row (staged in shared memory: xs[0..n), every thread's writes to it done) quantized for the
// products that read it next: k_quantize's values and layout (kind 1, Q8_256: a warp per 256-block, lane l holding
// values l + 32 j) or k_quantize32's (kind 2, Q8_32: a warp per 32-block). amax is a max, so any order gives the
// same scale; the rest is k_quantize's formulas value by value.
__device__ void quantize_staged(const float* xs, int64_t n, int kind, int8_t* __restrict__ q, float* __restrict__ dx) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  if (kind == (int)ActKind::Q8_256) {
    for (int64_t b = warp; b < n / QK_K; b += warps) quantize_q8_256_warp(xs + b * QK_K, q + b * QK_K, dx + b);
  } else {
    for (int64_t b = warp; b < n / 32; b += warps) {
      const float v = xs[b * 32 + lane];
      float a = fabsf(v);
      for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
      const float iscale = a > kAct32Tiny ? __fdiv_rn(127.f, a) : 0.f;
      q[b * 32 + lane] = (int8_t)rintf(__fmul_rn(iscale, v));
      if (lane == 0) dx[b] = __fdiv_rn(a, 127.f);
    }
  }
}

// kind != 0 (n <= kNormStage, whole blocks): y's row t also quantized into q / dx (quantize_staged; T rows).
__global__ void __launch_bounds__(256) k_rmsnorm(const float* __restrict__ x, int64_t ldx, const float* __restrict__ w,
                                                 int64_t n, float eps, float* __restrict__ y, int64_t ldy, int kind,
                                                 int8_t* __restrict__ q, float* __restrict__ dx) {
  pdl_wait();
  __shared__ float xs[kNormStage];
  __shared__ float rr;
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const float* xr = x + t * ldx;
  const bool staged = n <= kNormStage;
  if (staged)
    for (int64_t i = tid; i < n; i += blockDim.x) xs[i] = xr[i];
  __syncthreads();
  const float* src = staged ? xs : xr;
  if (tid < 32) {
    float l = 0.f;
    if (lane < 16) {
#pragma unroll 8
      for (int64_t i = lane; i < n; i += 16) l = __fadd_rn(l, __fmul_rn(src[i], src[i]));
    }
    const float s8 = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 8));
    const float s4 = __fadd_rn(s8, __shfl_down_sync(0xffffffffu, s8, 4));
    const float s4_1 = __shfl_sync(0xffffffffu, s4, 1), s4_2 = __shfl_sync(0xffffffffu, s4, 2),
                s4_3 = __shfl_sync(0xffffffffu, s4, 3), s4_0 = __shfl_sync(0xffffffffu, s4, 0);
    const float ss = __fadd_rn(__fadd_rn(s4_0, s4_2), __fadd_rn(s4_1, s4_3));
    if (tid == 0) rr = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
  }
  __syncthreads();
  const float r = rr;
  if (!kind) {
    for (int64_t i = tid; i < n; i += blockDim.x) y[t * ldy + i] = __fmul_rn(__fmul_rn(src[i], r), w[i]);
    return;
  }
  for (int64_t i = tid; i < n; i += blockDim.x) {  // staged: xs[i] is this thread's own
    const float v = __fmul_rn(__fmul_rn(xs[i], r), w[i]);
    y[t * ldy + i] = v;
    xs[i] = v;
  }
  __syncthreads();
  const int64_t nb = n / (kind == (int)ActKind::Q8_256 ? QK_K : 32);
  quantize_staged(xs, n, kind, q + t * n, dx + t * nb);
}

// Threads per block for a product of `units` 16-row groups (x slots): 64 (4 row groups) when 256-thread blocks
// would not give every SM two blocks, so that small matrices (routers, experts, the DeltaNet gates) spread over
// more SMs. What each lane computes does not depend on it.
int threads_for(int64_t units) { return units < 2 * 132 ? 64 : 256; }

// k_int's full staging for T rows of `cols` columns (quantized: a byte a value, a float a 256-block), or 0 where it is
// over kFullStageMax (2 blocks an SM: with k_int's static shared memory, under the SM's 228 KB) or over what the card
// allowed (g_full_stage_max).
constexpr size_t kFullStageMax = 72 * 1024;
size_t g_full_stage_max = kFullStageMax;
size_t full_stage_bytes(int T, int64_t cols) {
  const size_t b = (size_t)T * cols + (size_t)T * (cols / QK_K) * sizeof(float);
  return b <= g_full_stage_max ? b : 0;
}
// Dynamic shared memory up to kFullStageMax for kern: static and dynamic together over 48 KB need it. Set once per
// device, for every k_int that stages its rows (allow_int_smem, from init_tables).
template <class K>
void allow_smem(K kern) {
  g_full_stage_max = std::min(g_full_stage_max, allow_dyn_smem(kern, kFullStageMax, "allow k_int's shared memory"));
}
template <class D>
void allow_int_smem() {
  allow_smem(k_int<D, 2>);
  allow_smem(k_int<D, 4>);
  allow_smem(k_int<D, 8>);
  allow_smem(k_int<D, 16>);
  allow_smem(k_int<D, kTileRows, true>);
}

// The residual add, then k_rmsnorm of the sum: x[i] = x[i] + y[i] (written back), the row staged as it is formed.
// And quantized as k_rmsnorm's (kind != 0).
__global__ void __launch_bounds__(256) k_add_rmsnorm(float* __restrict__ x, const float* __restrict__ yv,
                                                     const float* __restrict__ w, int64_t n, float eps,
                                                     float* __restrict__ out, int kind, int8_t* __restrict__ q,
                                                     float* __restrict__ dx) {
  pdl_wait();
  __shared__ float xs[kNormStage];
  __shared__ float rr;
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  float* xr = x + t * n;
  const float* yr = yv + t * n;
  for (int64_t i = tid; i < n; i += blockDim.x) {
    const float v = __fadd_rn(xr[i], yr[i]);
    xs[i] = v;
    xr[i] = v;
  }
  __syncthreads();
  if (tid < 32) {
    float l = 0.f;
    if (lane < 16) {
#pragma unroll 8
      for (int64_t i = lane; i < n; i += 16) l = __fadd_rn(l, __fmul_rn(xs[i], xs[i]));
    }
    const float s8 = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 8));
    const float s4 = __fadd_rn(s8, __shfl_down_sync(0xffffffffu, s8, 4));
    const float s4_1 = __shfl_sync(0xffffffffu, s4, 1), s4_2 = __shfl_sync(0xffffffffu, s4, 2),
                s4_3 = __shfl_sync(0xffffffffu, s4, 3), s4_0 = __shfl_sync(0xffffffffu, s4, 0);
    const float ss = __fadd_rn(__fadd_rn(s4_0, s4_2), __fadd_rn(s4_1, s4_3));
    if (tid == 0) rr = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
  }
  __syncthreads();
  const float r = rr;
  for (int64_t i = tid; i < n; i += blockDim.x) {
    const float v = __fmul_rn(__fmul_rn(xs[i], r), w[i]);
    out[t * n + i] = v;
    xs[i] = v;  // this thread's own
  }
  if (!kind) return;
  __syncthreads();
  const int64_t nb = n / (kind == (int)ActKind::Q8_256 ? QK_K : 32);
  quantize_staged(xs, n, kind, q + t * n, dx + t * nb);
}

// layers.cu k_gated_norm's rows (rms_scale_warp and gated_value of each head of n) for a
// window row t = blockIdx.x of `heads` heads (a warp a head), the row's heads * n outputs also staged and quantized
// as k_rmsnorm's (quantize_staged) for the product after it (DeltaNet's ssm_out). The row's x and z are staged in
// shared memory first (coalesced loads by the whole block; 2 heads n <= kNormStage), each head's sum and outputs then
// read them there: the same values. 1024 threads: a warp a head at once for up to 32 heads.
constexpr int kGatedNormThreads = 1024;
__global__ void __launch_bounds__(kGatedNormThreads) k_gated_norm_q(const float* __restrict__ x, const float* __restrict__ w,
                                                      const float* __restrict__ z, int64_t n, int heads, float eps,
                                                      bool sig, float* __restrict__ y, int kind,
                                                      int8_t* __restrict__ q, float* __restrict__ dx) {
  pdl_wait();
  __shared__ float xs[kNormStage];
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t N = (int64_t)heads * n;
  float* zs = xs + N;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    xs[i] = x[t * N + i];
    zs[i] = z[t * N + i];
  }
  __syncthreads();
  for (int hh = warp; hh < heads; hh += blockDim.x >> 5) {
    const int64_t at = t * N + hh * n;
    float* xr = xs + hh * n;  // the head's inputs, then (each lane its own values, after the sum) its outputs
    const float r = rms_scale_warp(xr, n, eps);
    for (int64_t i = lane; i < n; i += 32) {
      const float o = gated_value(xr[i], r, w[i], zs[hh * n + i], sig);
      y[at + i] = o;
      xr[i] = o;
    }
  }
  __syncthreads();
  quantize_staged(xs, N, kind, q + t * N, dx + t * (N / (kind == (int)ActKind::Q8_256 ? QK_K : 32)));
}

template <class D, int R>
void launch_float_r(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, cudaStream_t st) {
  const int threads = threads_for((W.rows + (int64_t)kRowsPerBlock * R - 1) / ((int64_t)kRowsPerBlock * R));
  const int64_t per_block = (int64_t)(threads / 16) * R;
  const dim3 grid((unsigned)((W.rows + per_block - 1) / per_block));
  auto go = [&](auto kern) {
    launch(kern, grid, threads, 0, st, W.data, W.row_bytes, W.rows, W.cols, x, ldx, T, y, ldy, nullptr, 0, 1);
  };
  // prompt pieces: a block per (rows, 16 activation rows); small matrices (the routers) keep a block per activation
  // row below unless prefer_row_groups (16-row blocks measured slower there: docs/BENCHMARKS.md)
  if (T > kMaxT && (threads != 64 || g_row_groups)) {
    launch(k_float<D, kMaxT, R>, dim3(grid.x, (unsigned)((T + kMaxT - 1) / kMaxT)), threads, 0, st, W.data,
           W.row_bytes, W.rows, W.cols, x, ldx, T, y, ldy, nullptr, 0, 1);
    return;
  }
  const bool small = (int64_t)W.rows * (int64_t)W.row_bytes <= g_float_split_bytes && T <= kFloatSplitMaxT;
  if (T > 1 && (threads == 64 || small)) {  // small matrices (the router): a block per (rows, activation row), each T = 1
    launch(k_float<D, 1, R>, dim3(grid.x, (unsigned)T), threads, 0, st, W.data, W.row_bytes, W.rows, W.cols, x, ldx, T,
           y, ldy, nullptr, 0, 1);
    return;
  }
  if (T == 1) go(k_float<D, 1, R>);
  else if (T == 2) go(k_float<D, 2, R>);
  else if (T <= 4) go(k_float<D, 4, R>);
  else if (T <= 8) go(k_float<D, 8, R>);
  else go(k_float<D, 16, R>);
}
template <class D>
void launch_float(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, cudaStream_t st) {
  // prompt pieces; windows of fewer rows over wide matrices (the default model's head)
  if (g_float_tiles && T >= g_float_tiles_min_t && (T >= kFloatTileMinT || W.rows >= g_float_tiles_min_w)) {
    const dim3 grid((unsigned)((W.rows + kFloatTile - 1) / kFloatTile), (unsigned)((T + kFloatTile - 1) / kFloatTile));
    launch(k_float_tiles<D>, grid, 256, 0, st, W.data, W.row_bytes, W.rows, W.cols, x, ldx, T, y, ldy);
    return;
  }
  // F32/F16/BF16: 4 rows a thread once the grid still fills the card several times over (132 SMs x 8 blocks of 256
  // threads); the block types decode more per value and ran slower that way on the H200 (docs/BENCHMARKS.md)
  if (D::kPlain && W.rows >= kRowsForR4) launch_float_r<D, 4>(W, x, ldx, T, y, ldy, st);
  else launch_float_r<D, 1>(W, x, ldx, T, y, ldy, st);
}

// The product over rows already quantized (q, dx: k_quantize's layout, T rows of W.cols).
template <class D>
void launch_int_q(const MatView& W, const int8_t* q, const float* dx, int T, float* y, int64_t ldy, cudaStream_t st) {
  const int64_t nb = W.cols / QK_K;
  const int64_t g16 = (W.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  // prefer_kquant_windows: a small K-quant matrix over a prompt piece (T > kMaxT) on k_int<D, kMaxT> in 256-thread
  // blocks (16 weight rows sharing each staged activation tile), not a block per (row group, activation row); on
  // cards with the int8 tensor cores Q4_K / Q5_K / Q6_K prompt pieces take k_mma first (below)
  const bool kq_windows = g_kquant_windows && T > kMaxT && (std::is_same_v<D, Q4_K> || std::is_same_v<D, Q5_K> ||
                                                            std::is_same_v<D, Q6_K>);
  const int threads = kq_windows ? 256 : threads_for(g16);
  const int64_t groups = (W.rows + threads / 16 - 1) / (threads / 16);  // at most 4096 blocks, each over several
  if constexpr (std::is_same_v<D, IQ2_XXS>) {
    const size_t psm = panel_smem_bytes(nb);
    const size_t ssm = panel_staged_smem_bytes(nb);
    if (T >= kPanelMinT && g_iq2_panel && g_iq2_panel_staged && ssm <= g_panel_staged_smem_max && mma_available() &&
        reinterpret_cast<uintptr_t>(q) % 16 == 0) {
      // as below, each warp's 16 activation rows staged in shared memory (iq2_mma.cuh k_iq2xxs_panel_staged: one
      // block an SM); a block's tile range a multiple of its warps where it holds more than one round of them
      const int64_t tiles = (T + 15) / 16;
      const int64_t gy0 = std::min<int64_t>(tiles, std::max<int64_t>(1, (2 * 132 + g16 - 1) / g16));
      int64_t per_y = (tiles + gy0 - 1) / gy0;
      if (per_y > kPanelWarps) per_y = (per_y + kPanelWarps - 1) / kPanelWarps * kPanelWarps;
      launch(k_iq2xxs_panel_staged, dim3((unsigned)g16, (unsigned)((tiles + per_y - 1) / per_y)), 32 * kPanelWarps,
             ssm, st, W.data, W.row_bytes, W.rows, nb, q, dx, T, (int)per_y, y, ldy);
      return;
    }
    if (T >= kPanelMinT && g_iq2_panel && psm <= g_panel_smem_max && mma_available()) {
      // prompt pieces: 16 weight rows a block decoded once into shared memory (iq2_mma.cuh k_iq2xxs_panel); the
      // activation rows split in y where the weight rows alone give under two blocks an SM
      const int64_t tiles = (T + 7) / 8;
      const int64_t gy0 = std::min<int64_t>(tiles, std::max<int64_t>(1, (2 * 132 + g16 - 1) / g16));
      const int per_y = (int)((tiles + gy0 - 1) / gy0);
      launch(k_iq2xxs_panel, dim3((unsigned)g16, (unsigned)((tiles + per_y - 1) / per_y)), 32 * kPanelWarps, psm, st,
             W.data, W.row_bytes, W.rows, nb, q, dx, T, per_y, y, ldy);
      return;
    }
    if (T >= g_mma_min_t && mma_available()) {  // the tensor cores, a warp per 16 weight rows (mma.cuh)
      const unsigned gx = (unsigned)((g16 + kMmaWarps - 1) / kMmaWarps);
      if (T <= 8) launch(k_mma<Iq2Mma, 1>, gx, 32 * kMmaWarps, 0, st, W.data, W.row_bytes, W.rows, nb, q, dx, T, y, ldy);
      else launch(k_mma<Iq2Mma, 2>, dim3(gx, (unsigned)((T + 15) / 16)), 32 * kMmaWarps, 0, st, W.data, W.row_bytes,
                  W.rows, nb, q, dx, T, y, ldy);
      return;
    }
  }
  if constexpr (kHasKqMma<D>) {
    if (T > kMaxT && kq_mma_fit<D>(W.data, W.row_bytes, 0)) {  // prompt pieces on the tensor cores (kq_mma.cuh)
      const unsigned gx = (unsigned)((g16 + kMmaWarps - 1) / kMmaWarps);
      launch(k_mma<typename KqMmaOf<D>::type, 2>, dim3(gx, (unsigned)((T + 15) / 16)), 32 * kMmaWarps, 0, st, W.data,
             W.row_bytes, W.rows, nb, q, dx, T, y, ldy);
      return;
    }
  }
  if (T == 1 || threads == 64) {
    // A block per (row group, activation row), each the T = 1 kernel (IQ2_XXS: a warp per row). T = 1: spread over
    // the waves (capping it at one wave of fat blocks slowed the 80B step, docs/BENCHMARKS.md fifth milestone). Small
    // matrices over several rows (the 80B file's attention, DeltaNet and shared-expert products) take it too, as
    // k_float's small matrices, instead of 2-4 warps an SM each summing all T rows in turn (docs/BENCHMARKS.md,
    // issue 19's ninth milestone: the 80B prompt piece's dense products 79 -> 59 ms). Each row's value is the T = 1
    // kernel's, as every T's is.
    if constexpr (std::is_same_v<D, IQ2_XXS>) {
      launch_iq2_warp1<false>(W, nullptr, 0, 0, nullptr, T, 1, q, dx, y, nullptr, ldy, st);
    } else {
      const int64_t gx = groups < kMaxIntBlocks ? groups : kMaxIntBlocks;
      if constexpr (kHasKqLanes<D>) {
        if (kq_lanes_fit<D>(W.data, W.row_bytes, 0)) {
          launch_kq_lanes<D>(W, 0, nullptr, T, 1, q, dx, y, ldy, threads, gx, st);
          return;
        }
      }
      launch(k_int<D, 1>, dim3((unsigned)gx, (unsigned)T), threads, 0, st, W.data, W.row_bytes, W.rows, nb, q, dx, 1, y,
             ldy, nullptr, 0, 1, nullptr, nullptr, nullptr, nullptr, 0);
    }
    return;
  }
  // T > 1 on 256-thread blocks: one wave (T > 4: 2 blocks an SM, their registers), grid-stride; past kMaxT rows
  // (prompt pieces) blocks of kMaxT activation rows in y
  const int Tb = T < kMaxT ? T : kMaxT;
  const int64_t cap = 132 * (Tb > 4 ? 2 : 3);
  const dim3 grid((unsigned)(groups < cap ? groups : cap), (unsigned)((T + kMaxT - 1) / kMaxT));  // the IQ tables: once a block
  auto go = [&](auto kern) {
    const size_t fb = full_stage_bytes(Tb, W.cols);
    launch(kern, grid, threads, fb, st, W.data, W.row_bytes, W.rows, nb, q, dx, T, y, ldy, nullptr, 0, 1, nullptr,
           nullptr, nullptr, nullptr, fb ? 1 : 0);
  };
  if constexpr (std::is_same_v<D, IQ2_XXS>) {  // a warp per row, up to 4 rows together
    const int rpw = nb <= 2 ? 4 : 1;
    const unsigned gx = (unsigned)((W.rows + 8 * rpw - 1) / (8 * rpw));
    auto warp = [&](auto kern) {
      launch(kern, gx, 256, 0, st, W.data, W.row_bytes, W.rows, nb, q, dx, y, ldy, T, rpw);
    };
    const bool u4 = g_iq2_window_u4 && nb > 2;  // rows of at most 2 blocks: 2 a step (4 rows a warp)
    if (T == 2) return u4 ? warp(k_iq2xxs_warp<4, 2>) : warp(k_iq2xxs_warp<2, 2>);
    if (T <= 4) return u4 ? warp(k_iq2xxs_warp<4, 4>) : warp(k_iq2xxs_warp<2, 4>);
  }
  if (T == 2) go(k_int<D, 2>);
  else if (T <= 4) go(k_int<D, 4>);
  else if (T <= 8) go(k_int<D, 8>);
  else go(k_int<D, kMaxT>);
}

// The 32-value block types' product over rows already quantized (q, dx: k_quantize32's layout, T rows of W.cols).
template <class D>
void launch_b32q_q(const MatView& W, const int8_t* q, const float* dx, int T, float* y, int64_t ldy, cudaStream_t st) {
  const int64_t nb = W.cols / 32;
  const int threads = threads_for((W.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const dim3 grid((unsigned)((W.rows + threads / 16 - 1) / (threads / 16)));
  auto go = [&](auto kern) {
    launch(kern, grid, threads, 0, st, W.data, W.row_bytes, W.rows, nb, q, dx, T, y, ldy, nullptr, 0, 1);
  };
  if (T > 1 && threads == 64 && g_b32q_split) {  // small matrices: a block per (rows, activation row), each T = 1
    launch(k_b32q<D, 1>, dim3(grid.x, (unsigned)T), threads, 0, st, W.data, W.row_bytes, W.rows, nb, q, dx, 1, y, ldy,
           nullptr, 0, 1);
    return;
  }
  if (T == 1) go(k_b32q<D, 1>);
  else if (T == 2) go(k_b32q<D, 2>);
  else if (T <= 4) go(k_b32q<D, 4>);
  else if (T <= 8) go(k_b32q<D, 8>);
  else go(k_b32q<D, 16>);
}

// Calls f(D{}, kind) for the decoder of `type` (kind: an integral_constant of matmul.h's ActKind); false if the
// type has no CUDA kernel.
using kFloat = std::integral_constant<ActKind, ActKind::Float>;
using kQ8_256 = std::integral_constant<ActKind, ActKind::Q8_256>;
using kQ8_32 = std::integral_constant<ActKind, ActKind::Q8_32>;
template <class F>
bool with_decoder(uint32_t type, F&& f) {
  switch (type) {
    case GGML_F32: f(F32{}, kFloat{}); return true;
    case GGML_F16: f(F16{}, kFloat{}); return true;
    case GGML_BF16: f(BF16{}, kFloat{}); return true;
    case GGML_Q8_0: f(Q8_0{}, kFloat{}); return true;
    case GGML_Q4_0: f(Q4_0{}, kQ8_32{}); return true;
    case GGML_Q4_1: f(Q4_1{}, kQ8_32{}); return true;
    case GGML_Q5_0: f(Q5_0{}, kQ8_32{}); return true;
    case GGML_Q5_1: f(Q5_1{}, kQ8_32{}); return true;
    case GGML_IQ4_NL: f(IQ4_NL{}, kQ8_32{}); return true;
    case GGML_MXFP4: f(MXFP4{}, kQ8_32{}); return true;
    case GGML_Q2_K: f(Q2_K{}, kQ8_256{}); return true;
    case GGML_Q3_K: f(Q3_K{}, kQ8_256{}); return true;
    case GGML_Q4_K: f(Q4_K{}, kQ8_256{}); return true;
    case GGML_Q5_K: f(Q5_K{}, kQ8_256{}); return true;
    case GGML_Q6_K: f(Q6_K{}, kQ8_256{}); return true;
    case GGML_IQ2_XXS: f(IQ2_XXS{}, kQ8_256{}); return true;
    case GGML_IQ3_XXS: f(IQ3_XXS{}, kQ8_256{}); return true;
    case GGML_IQ4_XS: f(IQ4_XS{}, kQ8_256{}); return true;
    default: return false;
  }
}

bool g_pdl_card = false;  // sm_90 or later (init_tables)
bool g_pdl_on = true, g_prefetch_on = true;  // prefer_pdl
bool g_pdl_windows = false;                  // prefer_pdl: PDL for the 5..16-row windows too
int g_step_rows = 1;                         // step_rows
bool g_norm_quant = true;                    // prefer_norm_quant

}  // namespace

bool pdl_on() { return g_pdl_card && g_pdl_on; }

bool pdl_launch() { return pdl_on() && (g_pdl_windows || g_step_rows <= 4 || g_step_rows > 16); }

void step_rows(int T) { g_step_rows = T; }

// c_prefetch follows pdl_on() and prefer_pdl's prefetch (the prefetch only pays before a pdl_wait)
static void set_prefetch() {
  const int v = pdl_on() && g_prefetch_on ? 1 : 0;
  check(cudaMemcpyToSymbol(c_prefetch, &v, sizeof v), "set the weight prefetch");
}

void prefer_norm_quant(bool on) { g_norm_quant = on; }

void prefer_iq2_rows(int dense, int sel, int pair) {
  auto ok = [](int r) { return r == 1 || r == 2 || r == 4; };
  if (!ok(dense) || !ok(sel) || !ok(pair))
    throw std::invalid_argument("prefer_iq2_rows: rows a warp must be 1, 2 or 4, not dense=" + std::to_string(dense) +
                                " sel=" + std::to_string(sel) + " pair=" + std::to_string(pair));
  g_iq2_rows_dense = dense;
  g_iq2_rows_sel = sel;
  g_iq2_rows_pair = pair;
}

void prefer_iq2_window_u4(bool on) { g_iq2_window_u4 = on; }

void prefer_pdl(bool on, bool prefetch, bool windows) {
  g_pdl_on = on;
  g_prefetch_on = prefetch;
  g_pdl_windows = windows;
  set_prefetch();
}

void init_tables() {
  int dev = 0, major = 0;
  check(cudaGetDevice(&dev), "get the current device");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "read the compute capability");
  g_mma_card = major >= 8;
  g_pdl_card = major >= 9;
  set_prefetch();
  check(cudaMemcpyToSymbol(g_iq2xxs_grid, kIq2xxsGrid, sizeof(kIq2xxsGrid)), "copy the IQ2_XXS grid");
  check(cudaMemcpyToSymbol(g_iq3xxs_grid, kIq3xxsGrid, sizeof(kIq3xxsGrid)), "copy the IQ3_XXS grid");
  check(cudaMemcpyToSymbol(g_ksigns, kKsigns, sizeof(kKsigns)), "copy the IQ sign table");
  check(cudaMemcpyToSymbol(g_iq4_values, kIq4Values, sizeof(kIq4Values)), "copy the IQ4 values");
  check(cudaMemcpyToSymbol(g_mxfp4_values, kMxfp4Values, sizeof(kMxfp4Values)), "copy the MXFP4 values");
  int optin = 0;
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "read the shared memory a block may opt in to");
  g_smem_optin = (size_t)optin;
  g_full_stage_max = kFullStageMax;
  g_panel_smem_max = allow_dyn_smem(k_iq2xxs_panel, kPanelMaxSmem, "allow the IQ2_XXS panel kernel its shared memory");
  g_panel_staged_smem_max = allow_dyn_smem(k_iq2xxs_panel_staged, kPanelStagedMaxSmem,
                                           "allow the staged IQ2_XXS panel kernel its shared memory");
  g_tile_stage_max = kTileStageMax;
  auto allow_stage = [](auto src) {
    using S = decltype(src);
    auto allow = [](auto kern) {
      g_tile_stage_max = std::min(g_tile_stage_max, allow_dyn_smem(kern, kTileStageMax,
                                                                   "allow the expert tiles their staged activations"));
    };
    allow(k_tiles_mma<S, 1, false, true>);
    allow(k_tiles_mma<S, 2, false, true>);
    allow(k_tiles_mma<S, 1, true, true>);
    allow(k_tiles_mma<S, 2, true, true>);
  };
  allow_stage(Iq2Mma{});
  allow_stage(Q4kMma{});
  allow_stage(Q5kMma{});
  allow_stage(Q6kMma{});
  for (uint32_t type = 0; type < 64; type++)  // every type with_decoder knows
    with_decoder(type, [](auto dec, auto kind) {
      if constexpr (decltype(kind)::value == ActKind::Q8_256) allow_int_smem<decltype(dec)>();
    });
}

void prefer_iq2_panel(bool on) { g_iq2_panel = on; }
void prefer_iq2_panel_staged(bool on) { g_iq2_panel_staged = on; }
void prefer_row_groups(bool on) { g_row_groups = on; }
void prefer_float_split(int64_t bytes) { g_float_split_bytes = bytes; }
void prefer_b32q_split(bool on) { g_b32q_split = on; }
void prefer_kq_lanes(bool on) { g_kq_lanes = on; }
void prefer_kq_pair(bool on) { g_kq_pair = on; }
void prefer_q5k_lanes(bool on) { g_q5k_lanes = on; }
void prefer_kquant_windows(bool on) { g_kquant_windows = on; }
void prefer_tile_prefetch(bool on) { g_tile_prefetch = on; }
void prefer_float_tiles(bool on, int min_rows, int64_t min_weight_rows) {
  STRATA_CHECK(min_rows >= 2, "cuda prefer_float_tiles: min_rows = ", min_rows, " (at least 2: one row is k_float's)");
  STRATA_CHECK(min_weight_rows >= 0, "cuda prefer_float_tiles: min_weight_rows = ", min_weight_rows);
  g_float_tiles = on;
  g_float_tiles_min_t = min_rows;
  g_float_tiles_min_w = min_weight_rows;
}
void prefer_tile_stage(bool on) { g_tile_stage = on; }

void prefer_mma(bool on, int min_rows) {
  STRATA_CHECK(min_rows >= 2, "cuda prefer_mma: min_rows = ", min_rows, " (at least 2: one row is the warp kernel's)");
  g_mma_on = on;
  g_mma_min_t = min_rows;
}
bool mma_used() { return mma_available(); }

bool matmul_supported(uint32_t type) {
  return with_decoder(type, [](auto, auto) {});
}

// q: rows x cols bytes, then dx: a float per row and activation block (256 or 32 values)
size_t act_bytes(ActKind kind, int64_t rows, int64_t cols) {
  if (kind == ActKind::Float) return 0;
  return (size_t)rows * cols + (size_t)rows * (cols / (kind == ActKind::Q8_32 ? 32 : QK_K)) * sizeof(float);
}
static size_t act_bytes(uint32_t type, int64_t rows, int64_t cols) { return act_bytes(act_kind(type), rows, cols); }

QRows qrows_at(const void* base, int64_t rows, int64_t cols) {  // cols % 32 == 0: dx 4-byte aligned
  const int8_t* q = static_cast<const int8_t*>(base);
  return {q, reinterpret_cast<const float*>(q + (size_t)rows * cols)};
}

namespace {
// x's rows quantized into qrows_at(dst, rows, cols) for `kind` (one launch).
void quantize_rows(ActKind kind, const float* x, int64_t ldx, int rows, int64_t cols, void* dst, cudaStream_t st) {
  int8_t* q = static_cast<int8_t*>(dst);
  float* dx = reinterpret_cast<float*>(q + (size_t)rows * cols);
  if (kind == ActKind::Q8_256)
    launch(k_quantize, dim3((unsigned)((cols / QK_K + 7) / 8), (unsigned)rows), 256, 0, st, x, ldx, cols / QK_K, q, dx);
  else
    launch(k_quantize32, dim3((unsigned)((cols / 32 + 7) / 8), (unsigned)rows), 256, 0, st, x, ldx, cols / 32, q, dx);
}
// pre, or x's rows quantized now into scratch
QRows rows_for(const QRows* pre, ActKind kind, const float* x, int64_t ldx, int rows, int64_t cols, void* scratch,
               cudaStream_t st) {
  if (pre) return *pre;
  quantize_rows(kind, x, ldx, rows, cols, scratch, st);
  return qrows_at(scratch, rows, cols);
}
}  // namespace

// The 32-value block types' kernels take at most kMaxT rows a launch; the others any number (blocks of kMaxT rows in
// y past it; IQ2_XXS on the tensor cores, 16 rows a block).
int matmul_pass_rows(uint32_t type) { return act32_type(type) ? kMaxT : kMaxPassRows; }

size_t matmul_scratch_bytes(uint32_t type, int T, int64_t cols) { return act_bytes(type, T, cols); }

void matmul(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, void* scratch, void* stream,
            const QRows* pre) {
  const int pass = matmul_pass_rows(W.type);
  STRATA_CHECK(T >= 1 && W.rows >= 1 && W.cols >= 1, "cuda matmul: T = ", T, ", W is ", W.rows, " x ", W.cols);
  STRATA_CHECK(!int_act_type(W.type) || W.cols % QK_K == 0, "cuda matmul: ", type_name(W.type), " needs cols % 256 == 0, got ",
               W.cols);
  STRATA_CHECK(!act32_type(W.type) || W.cols % 32 == 0, "cuda matmul: ", type_name(W.type), " needs cols % 32 == 0, got ",
               W.cols);
  STRATA_CHECK(ldx >= W.cols && ldy >= W.rows, "cuda matmul: ldx = ", ldx, " < cols or ldy = ", ldy, " < rows");
  STRATA_CHECK(((uintptr_t)W.data & 1) == 0, "cuda matmul: weights at an odd address");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const ActKind kind = act_kind(W.type);
  // int8 activations: all T rows quantized once (or given), the passes over them
  const QRows qr = kind == ActKind::Float ? QRows{} : rows_for(pre, kind, x, ldx, T, W.cols, scratch, st);
  const int64_t nb = W.cols / (kind == ActKind::Q8_32 ? 32 : QK_K);
  for (int t0 = 0; t0 < T; t0 += pass) {  // passes (matmul_pass_rows): each row's value is the same in any pass
    const int Tp = T - t0 < pass ? T - t0 : pass;
    const float* xp = x + t0 * ldx;
    const int8_t* qp = qr.q + (size_t)t0 * W.cols;
    const float* dxp = qr.dx + (size_t)t0 * nb;
    float* yp = y + t0 * ldy;
    const bool ok = with_decoder(W.type, [&](auto dec, auto k) {
      using D = decltype(dec);
      if constexpr (decltype(k)::value == ActKind::Q8_256) launch_int_q<D>(W, qp, dxp, Tp, yp, ldy, st);
      else if constexpr (decltype(k)::value == ActKind::Q8_32) launch_b32q_q<D>(W, qp, dxp, Tp, yp, ldy, st);
      else launch_float<D>(W, xp, ldx, Tp, yp, ldy, st);
    });
    if (!ok) fail<std::invalid_argument>("cuda matmul: no CUDA kernel for weight type ", type_name(W.type));
    check(cudaGetLastError(), "launch of the product kernel");
  }
}

size_t matmul_sel_scratch_bytes(uint32_t type, int n, int xdiv, int64_t cols) {
  return tile_offset(act_bytes(type, (n + xdiv - 1) / xdiv, cols)) + kTileScratch;
}

void matmul_sel(const MatView& W0, size_t ebytes, const int32_t* sel, int n, int xdiv, const float* x, int64_t ldx,
                float* y, int64_t ldy, void* scratch, void* stream, const QRows* pre) {
  STRATA_CHECK(n >= 1 && xdiv >= 1 && W0.rows >= 1 && W0.cols >= 1, "cuda matmul_sel: n = ", n, ", xdiv = ", xdiv);
  STRATA_CHECK(!int_act_type(W0.type) || W0.cols % QK_K == 0, "cuda matmul_sel: ", type_name(W0.type),
               " needs cols % 256 == 0, got ", W0.cols);
  STRATA_CHECK(!act32_type(W0.type) || W0.cols % 32 == 0, "cuda matmul_sel: ", type_name(W0.type),
               " needs cols % 32 == 0, got ", W0.cols);
  STRATA_CHECK(n <= 65535, "cuda matmul_sel: ", n, " slots in one call (at most 65535)");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int n_x = (n + xdiv - 1) / xdiv;  // activation rows read
  const bool ok = with_decoder(W0.type, [&](auto dec, auto kind) {
    using D = decltype(dec);
    if constexpr (decltype(kind)::value == ActKind::Q8_32) {
      const int64_t nb = W0.cols / 32;
      const QRows qr = rows_for(pre, ActKind::Q8_32, x, ldx, n_x, W0.cols, scratch, st);
      const int8_t* q = qr.q;
      const float* dx = qr.dx;
      const int threads = threads_for((W0.rows + kRowsPerBlock - 1) / kRowsPerBlock * n);
      const dim3 grid((unsigned)((W0.rows + threads / 16 - 1) / (threads / 16)), (unsigned)n);
      launch(k_b32q<D, 1>, grid, threads, 0, st, W0.data, W0.row_bytes, W0.rows, nb, q, dx, 1, y, ldy, sel, ebytes,
             xdiv);
    } else if constexpr (decltype(kind)::value == ActKind::Q8_256) {
      const int64_t nb = W0.cols / QK_K;
      const QRows qr = rows_for(pre, ActKind::Q8_256, x, ldx, n_x, W0.cols, scratch, st);
      const int8_t* q = qr.q;
      const float* dx = qr.dx;
      const TileBufs tb(scratch, act_bytes(W0.type, n_x, W0.cols));
      if constexpr (std::is_same_v<D, IQ2_XXS>) {
        launch_iq2_sel<false>(W0, nullptr, ebytes, 0, sel, n, xdiv, q, dx, y, nullptr, ldy, tb, st);
        return;
      }
      if constexpr (kHasKqMma<D>) {
        if (use_tiles(n, xdiv) && kq_mma_fit<D>(W0.data, W0.row_bytes, ebytes)) {  // tiles on the tensor cores
          over_tile_pieces(sel, n, xdiv, tb, st, [&](int gy) {
            launch_tiles_mma<typename KqMmaOf<D>::type, false>(W0, nullptr, ebytes, 0, xdiv, q, dx, y, nullptr, ldy, tb,
                                                                gy, st);
          });
          return;
        }
      }
      if (use_tiles(n, xdiv)) {  // over tiles of one expert's slots, 16 rows at a time
        const int64_t groups = (W0.rows + 15) / 16;
        over_tile_pieces(sel, n, xdiv, tb, st, [&](int gy) {
          // two waves of 2 blocks an SM (k_int<D, 16>'s registers), grid-stride over the row groups
          const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(groups, (132 * 4 + gy - 1) / gy));
          const size_t fb = full_stage_bytes(kTileRows, W0.cols);
          launch(k_int<D, kTileRows, true>, dim3((unsigned)gx, (unsigned)gy), 256, fb, st, W0.data, W0.row_bytes,
                 W0.rows, nb, q, dx, 0, y, ldy, sel, ebytes, xdiv, tb.e, tb.n, tb.slot, tb.count, fb ? 1 : 0);
        });
        return;
      }
      const int threads = threads_for((W0.rows + kRowsPerBlock - 1) / kRowsPerBlock * n);
      const int64_t groups = (W0.rows + threads / 16 - 1) / (threads / 16);
      const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(groups, kMaxIntBlocks / n));
      if constexpr (kHasKqLanes<D>) {
        if (kq_lanes_fit<D>(W0.data, W0.row_bytes, ebytes)) {
          launch_kq_lanes<D>(W0, ebytes, sel, n, xdiv, q, dx, y, ldy, threads, gx, st);
          return;
        }
      }
      launch(k_int<D, 1>, dim3((unsigned)gx, (unsigned)n), threads, 0, st, W0.data, W0.row_bytes, W0.rows, nb, q, dx, 1,
             y, ldy, sel, ebytes, xdiv, nullptr, nullptr, nullptr, nullptr, 0);
    } else {
      const int threads = threads_for((W0.rows + kRowsPerBlock - 1) / kRowsPerBlock * n);
      const dim3 grid((unsigned)((W0.rows + threads / 16 - 1) / (threads / 16)), (unsigned)n);
      launch(k_float<D, 1, 1>, grid, threads, 0, st, W0.data, W0.row_bytes, W0.rows, W0.cols, x, ldx, 1, y, ldy, sel,
             ebytes, xdiv);
    }
  });
  if (!ok) fail<std::invalid_argument>("cuda matmul_sel: no CUDA kernel for weight type ", type_name(W0.type));
  check(cudaGetLastError(), "launch of the expert product kernel");
}

bool matmul_sel_swiglu(const MatView& Wg, size_t gate_bytes, const MatView& Wu, size_t up_bytes, const int32_t* sel,
                       int n, int xdiv, const float* x, int64_t ldx, float* g, float* u, void* scratch, void* stream,
                       const QRows* pre) {
  if (Wg.type != Wu.type || Wg.rows != Wu.rows || Wg.cols != Wu.cols || Wg.row_bytes != Wu.row_bytes) return false;
  // IQ2_XXS always; Q4_K / Q5_K / Q6_K over tiles on the tensor cores, and over a few slots with prefer_kq_pair
  // (else the two products and silu_mul)
  auto kq_pair = [&](auto dec) {
    using D = decltype(dec);
    return use_tiles(n, xdiv) && kq_mma_fit<D>(Wg.data, Wg.row_bytes, gate_bytes) &&
           kq_mma_fit<D>(Wu.data, Wu.row_bytes, up_bytes);
  };
  const bool kq = (Wg.type == GGML_Q4_K && kq_pair(Q4_K{})) || (Wg.type == GGML_Q5_K && kq_pair(Q5_K{})) ||
                  (Wg.type == GGML_Q6_K && kq_pair(Q6_K{}));
  // Q4_K / Q5_K / Q6_K over a few slots: the dp4a lane kernel's gate / up pair (prefer_kq_pair; Q5_K's lanes: kq_lanes_fit)
  auto lanes_pair = [&](auto dec) {
    using D = decltype(dec);
    return g_kq_pair && !use_tiles(n, xdiv) && kq_lanes_fit<D>(Wg.data, Wg.row_bytes, gate_bytes) &&
           kq_lanes_fit<D>(Wu.data, Wu.row_bytes, up_bytes);
  };
  const bool lanes = (Wg.type == GGML_Q4_K && lanes_pair(Q4_K{})) || (Wg.type == GGML_Q5_K && lanes_pair(Q5_K{})) ||
                     (Wg.type == GGML_Q6_K && lanes_pair(Q6_K{}));
  if (Wg.type != GGML_IQ2_XXS && !kq && !lanes) return false;
  STRATA_CHECK(n >= 1 && n <= 65535 && xdiv >= 1 && Wg.cols % QK_K == 0, "cuda matmul_sel_swiglu: n = ", n,
               ", xdiv = ", xdiv, ", cols = ", Wg.cols);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int n_x = (n + xdiv - 1) / xdiv;
  const QRows qr = rows_for(pre, ActKind::Q8_256, x, ldx, n_x, Wg.cols, scratch, st);
  const int8_t* q = qr.q;
  const float* dx = qr.dx;
  const TileBufs tb(scratch, act_bytes(Wg.type, n_x, Wg.cols));
  if (Wg.type == GGML_IQ2_XXS) {
    launch_iq2_sel<true>(Wg, Wu.data, gate_bytes, up_bytes, sel, n, xdiv, q, dx, g, u, Wg.rows, tb, st);
  } else if (lanes) {  // matmul_sel's one-row grid (threads, blocks) for the pair
    const int threads = threads_for((Wg.rows + kRowsPerBlock - 1) / kRowsPerBlock * n);
    const int64_t groups = (Wg.rows + threads / 16 - 1) / (threads / 16);
    const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(groups, kMaxIntBlocks / n));
    if (Wg.type == GGML_Q4_K)
      launch_kq_lanes<Q4_K>(Wg, gate_bytes, sel, n, xdiv, q, dx, g, Wg.rows, threads, gx, st, Wu.data, up_bytes, u);
    else if (Wg.type == GGML_Q5_K)
      launch_kq_lanes<Q5_K>(Wg, gate_bytes, sel, n, xdiv, q, dx, g, Wg.rows, threads, gx, st, Wu.data, up_bytes, u);
    else
      launch_kq_lanes<Q6_K>(Wg, gate_bytes, sel, n, xdiv, q, dx, g, Wg.rows, threads, gx, st, Wu.data, up_bytes, u);
  } else {
    over_tile_pieces(sel, n, xdiv, tb, st, [&](int gy) {
      auto go = [&](auto src) {
        launch_tiles_mma<decltype(src), true>(Wg, Wu.data, gate_bytes, up_bytes, xdiv, q, dx, g, u, Wg.rows, tb, gy, st);
      };
      if (Wg.type == GGML_Q4_K) go(Q4kMma{});
      else if (Wg.type == GGML_Q5_K) go(Q5kMma{});
      else go(Q6kMma{});
    });
  }
  check(cudaGetLastError(), "launch of the fused expert gate / up kernel");
  return true;
}

namespace {

// A block per row: each thread dequantizes columns c = tid, tid + 256, ... of row ids[blockIdx.x] (D::value: the CPU
// dequantizer's one product per value).
template <class D>
__global__ void k_embed(const uint8_t* table, size_t row_bytes, int64_t cols, const int32_t* ids, float* out) {
  pdl_wait();
  const uint8_t* row = table + (size_t)ids[blockIdx.x] * row_bytes;
  float* o = out + (size_t)blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += 256) o[c] = D::value(row, c);
}

template <class F>
bool with_value_type(uint32_t type, F&& f) {
  switch (type) {
    case GGML_F32: f(F32{}); return true;
    case GGML_F16: f(F16{}); return true;
    case GGML_BF16: f(BF16{}); return true;
    case GGML_Q8_0: f(Q8_0{}); return true;
    default: return false;
  }
}

}  // namespace

bool embed_supported(uint32_t type) {
  return with_value_type(type, [](auto) {});
}

void embed_rows(const MatView& table, const int32_t* ids, int T, float* out, void* stream) {
  STRATA_CHECK(T >= 1 && T <= 65535, "cuda embed_rows: T = ", T);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool ok = with_value_type(table.type, [&](auto d) {
    using D = decltype(d);
    launch(k_embed<D>, (unsigned)T, 256, 0, st, table.data, table.row_bytes, table.cols, ids, out);
  });
  if (!ok) fail<std::invalid_argument>("cuda embed_rows: no device dequantizer for type ", type_name(table.type));
  check(cudaGetLastError(), "launch of the embedding kernel");
}

bool norm_quantizes(ActKind kind, int64_t n) {
  return g_norm_quant && kind != ActKind::Float && n <= kNormStage && n % (kind == ActKind::Q8_256 ? QK_K : 32) == 0;
}

bool rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y, int64_t ldy,
             void* stream, ActKind kind, void* qdst) {
  STRATA_CHECK(T >= 1 && n >= 1, "cuda rmsnorm: T = ", T, ", n = ", n);
  const bool quant = qdst && norm_quantizes(kind, n);
  const QRows qr = quant ? qrows_at(qdst, T, n) : QRows{};
  launch(k_rmsnorm, T, 256, 0, static_cast<cudaStream_t>(stream), x, ldx, w, n, eps, y, ldy, quant ? (int)kind : 0,
         const_cast<int8_t*>(qr.q), const_cast<float*>(qr.dx));
  check(cudaGetLastError(), "launch of the rmsnorm kernel");
  return quant;
}

bool add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int T, float eps, float* out, void* stream,
                 ActKind kind, void* qdst) {
  if (n > kNormStage || T < 1) return false;
  const bool quant = qdst && norm_quantizes(kind, n);
  const QRows qr = quant ? qrows_at(qdst, T, n) : QRows{};
  launch(k_add_rmsnorm, T, 256, 0, static_cast<cudaStream_t>(stream), x, y, w, n, eps, out, quant ? (int)kind : 0,
         const_cast<int8_t*>(qr.q), const_cast<float*>(qr.dx));
  check(cudaGetLastError(), "launch of the add + rmsnorm kernel");
  return true;
}

bool gated_norm_q(const float* x, const float* w, const float* z, int64_t n, int heads, int T, float eps, bool sig,
                  float* y, void* stream, ActKind kind, void* qdst) {
  if (!qdst || T < 1 || heads < 1 || 2 * (int64_t)heads * n > kNormStage || !norm_quantizes(kind, (int64_t)heads * n))
    return false;
  const QRows qr = qrows_at(qdst, T, (int64_t)heads * n);
  launch(k_gated_norm_q, T, kGatedNormThreads, 0, static_cast<cudaStream_t>(stream), x, w, z, n, heads, eps, sig, y, (int)kind,
         const_cast<int8_t*>(qr.q), const_cast<float*>(qr.dx));
  check(cudaGetLastError(), "launch of the gated norm kernel");
  return true;
}

}  // namespace strata::cuda
