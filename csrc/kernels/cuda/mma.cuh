// Products of many activation rows on the int8 tensor cores (mma.sync), with matmul.h's exact lane order, for any
// weight type with an MMA source S (iq2_mma.cuh: IQ2_XXS; kq_mma.cuh: Q4_K, Q6_K). Included by matmul.cu after the
// tile loop (over_tiles) and before the sources; sm_80 and later (mma_available()); the caller keeps the dp4a
// kernels for older cards.
//
// Why this is exact. matmul.h's value of y[t][r] needs, per 256-block, the 16 integer lane sums
//   P_k = sum over the 16 values v of lane k (v mod 32 in {2k, 2k + 1}) of w[v] q[v]
// (w the block's integer weights: IQ2_XXS (2 sc + 1) grid sign, Q4_K sc q, Q6_K sc (q - 32)), then
// L_k = fma(d * dx, (float)P_k, L_k) over the blocks in order and reduce16's tree; types with mins also the block's
// M = sum over its 256 values of m(v) q[v] and Lm = fma(dmin * dx, (float)M, Lm), y = tree - Lm. The tensor core
// computes integer dot products exactly (int32 accumulators), and P_k and M are integers, so any way of summing them
// gives the same P_k and M. One MMA per lane k: A = the 16 weight rows' 16 values of lane k (16 x 16), B = the same
// 16 values of 8 activation rows (k_quantize's lane-major layout keeps them contiguous: value 32 s + 2 k + i at
// 16 k + 2 s + i, the MMA's K index 2 s + i), C = P_k for 16 rows x 8 activation rows. w needs up to 13 bits, so A
// is w's two bytes: w = 256 hi + lo, hi signed, lo unsigned; two MMAs (s8 x s8 and u8 x s8) and P = 256 P_hi + P_lo,
// exact in int32. Then (float)P: by the 2^23 + 2^22 bias where |P| < 2^22 (S::kBiasP), else by the conversion (exact
// under 2^24). M: one m16n8k32 MMA per lane pair (k, k + 1), A = the mins (constant over a sub-block, so the same
// word for both lanes), chained in one int32 accumulator per output. Then the same fma chains and tree as the dp4a
// kernels: the same bits (tests/test_cuda_matmul.py, bit for bit against the CPU's scalar kernel).
//
// Fragments (PTX ISA, mma.m16n8k16 integer): thread (g, c4) = (lane / 4, lane % 4) holds A rows g and g + 8 at K
// 4 c4 .. 4 c4 + 3 (sub-blocks 2 c4 and 2 c4 + 1 of the 256-block), B's K 4 c4 .. 4 c4 + 3 of activation row g, and
// C at rows g, g + 8 and activation rows 2 c4, 2 c4 + 1. So each thread decodes 4 sub-blocks (2 rows x 2) of each
// block once and keeps all 16 lanes of its 4 outputs per 8 activation rows: reduce16 needs no shuffle.
//
// An MMA source S: kBytes (a block), kMins, kBiasP, kAhead (the next block's part loaded while this one is summed:
// the small parts), Tabs (its shared tables: load() by the whole block, before a barrier), Part (thread (g, c4)'s share
// of a block of rows g and g + 8: load(b0, b1, c4), d(i), and with mins dmin(i) and mins(i), the m16n8k32 A word of
// row i: its sub-blocks' mins (m_2c4, m_2c4, m_2c4+1, m_2c4+1)), and frags(part, l, tabs, a): the A fragments of
// lanes k = 4 l + m, a[m] = (lo of row g, lo of row g + 8, hi of row g, hi of row g + 8), each 4 bytes at K
// 4 c4 .. 4 c4 + 3.
// No namespace of its own: it is included inside matmul.cu's (anonymous, in strata::cuda).
#pragma once

__device__ __forceinline__ bool mma_compiled() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return true;
#else
  return false;
#endif
}

// d[4] = A . B + c (every element of C = c): A u8 (lo) or s8 (hi) 16 x 16, B s8 16 x 8.
template <bool kUnsignedA>
__device__ __forceinline__ void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kUnsignedA)
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(c));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(c));
#else
  d[0] = d[1] = d[2] = d[3] = 0;
  __trap();  // the host never launches these kernels below sm_80 (mma_available)
#endif
}

// c[4] += A . B, m16n8k32: A u8 16 x 32 with rows g, g + 8 the words a0, a1 at K 4 c4 .. and again at K 16 + 4 c4 ..
// (the mins: the same for both halves), B s8 32 x 8: b0 at K 4 c4 .., b1 at K 16 + 4 c4 .. of column g.
__device__ __forceinline__ void mma_k32_acc(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%4,%5}, {%6,%7}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

constexpr int kMmaBias = 0x4B400000;         // the bits of 2^23 + 2^22: bits + P is the float 2^23 + 2^22 + P
constexpr float kMmaBiasF = 12582912.f;      // 2^23 + 2^22

// An activation word or scale: from global memory (read-only path) or, kShared, from shared memory.
template <bool kShared, class V>
__device__ __forceinline__ V act_load(const V* p) {
  if constexpr (kShared) return *p;
  else return __ldg(p);
}

// The warp's 16 weight rows r0 .. r0 + 15 of W (rows past `rows` read row rows - 1, their outputs unused) against
// NT x 8 activation rows: thread (g, c4)'s B rows qb[n] (activation row 8 n + g; q of block 0) and its C rows' dx
// (dxc[n][j]: activation row 8 n + 2 c4 + j). out[n][e]: the finished value (matmul.h's y) of weight row
// r0 + g + 8 (e >> 1) and activation row 8 n + 2 c4 + (e & 1).
template <class S, int NT, bool kSharedAct = false>
__device__ __forceinline__ void mma_rows(const uint8_t* __restrict__ W, size_t row_bytes, int64_t r0, int64_t rows,
                                         int64_t nb, const int8_t* const (&qb)[NT], const float* const (&dxc)[NT][2],
                                         const typename S::Tabs& tabs, float (&out)[NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  const uint8_t* row0 = W + (r0 + g < rows ? r0 + g : rows - 1) * row_bytes;
  const uint8_t* row1 = W + (r0 + g + 8 < rows ? r0 + g + 8 : rows - 1) * row_bytes;
  constexpr int NM = S::kMins ? NT : 1;
  float L[NT][4][16], Lm[NM][4];
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
      for (int k = 0; k < 16; k++) L[n][e][k] = 0.f;
#pragma unroll
  for (int n = 0; n < NM; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) Lm[n][e] = 0.f;
  typename S::Part part;
  if constexpr (S::kAhead) part.load(row0, row1, c4);
  for (int64_t b = 0; b < nb; b++) {
    typename S::Part cur;
    if constexpr (S::kAhead) {
      cur = part;
      if (b + 1 < nb) part.load(row0 + (b + 1) * S::kBytes, row1 + (b + 1) * S::kBytes, c4);
    } else {
      cur.load(row0 + b * S::kBytes, row1 + b * S::kBytes, c4);
    }
    float dd[NT][4], dm[NM][4];
    {
      const float d0 = cur.d(0), d1 = cur.d(1);
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const float dxv = act_load<kSharedAct>(dxc[n][j] + b);
          dd[n][j] = __fmul_rn(d0, dxv);
          dd[n][2 + j] = __fmul_rn(d1, dxv);
          if constexpr (S::kMins) {
            dm[n][j] = __fmul_rn(cur.dmin(0), dxv);
            dm[n][2 + j] = __fmul_rn(cur.dmin(1), dxv);
          }
        }
    }
    int Mc[NM][4];  // with mins: the bias + M, summed over the lane pairs
    uint32_t bprev[NM];
#pragma unroll
    for (int n = 0; n < NM; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) Mc[n][e] = kMmaBias;
#pragma unroll
    for (int l = 0; l < 4; l++) {  // lanes 4 l .. 4 l + 3
      uint4 a[4];
      S::frags(cur, l, tabs, a);
#pragma unroll
      for (int m = 0; m < 4; m++) {
        const int k = 4 * l + m;
        const uint32_t lo0 = a[m].x, lo1 = a[m].y, hi0 = a[m].z, hi1 = a[m].w;
#pragma unroll
        for (int n = 0; n < NT; n++) {
          const uint32_t bq = act_load<kSharedAct>(reinterpret_cast<const uint32_t*>(qb[n] + b * QK_K + 16 * k + 4 * c4));
          int plo[4], phi[4];
          mma_k16<true>(plo, lo0, lo1, bq, S::kBiasP ? kMmaBias : 0);
          mma_k16<false>(phi, hi0, hi1, bq, 0);
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int P = phi[e] * 256 + plo[e];
            const float p = S::kBiasP ? __fsub_rn(__int_as_float(P), kMmaBiasF) : __int2float_rn(P);  // (float)P, exact
            L[n][e][k] = fmaf(dd[n][e], p, L[n][e][k]);
          }
          if constexpr (S::kMins) {
            if (m & 1) mma_k32_acc(Mc[n], cur.mins(0), cur.mins(1), bprev[n], bq);
            else bprev[n] = bq;
          }
        }
      }
    }
    if constexpr (S::kMins) {
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)  // (float)M, exact: |M| <= 256 * 63 * 127 < 2^22
          Lm[n][e] = fmaf(dm[n][e], __fsub_rn(__int_as_float(Mc[n][e]), kMmaBiasF), Lm[n][e]);
    }
  }
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)  // reduce16's tree, then k_int's y = s - Lm (Lm stays 0 without mins)
      out[n][e] = __fsub_rn(tree16(L[n][e]), Lm[S::kMins ? n : 0][e]);
}

constexpr int kMmaWarps = 4;  // warps a block: each 16 weight rows

// Thread (g, c4)'s activation rows for mma_rows: qb[n] for MMA column 8 n + g (B) and dxc[n][j] for columns
// 8 n + 2 c4 + j (C), each at activation row row_of(column) of q / dx (rows of nb blocks).
template <int NT, class F>
__device__ __forceinline__ void mma_act_rows(const int8_t* q, const float* dx, int64_t nb, F&& row_of,
                                             const int8_t* (&qb)[NT], const float* (&dxc)[NT][2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; n++) {
    qb[n] = q + row_of(8 * n + g) * nb * QK_K;
#pragma unroll
    for (int j = 0; j < 2; j++) dxc[n][j] = dx + row_of(8 * n + 2 * c4 + j) * nb;
  }
}

// Dense rows: y[t][r] for t < T over W's rows, a warp per 16 rows (block x: kMmaWarps of them) and 8 NT activation
// rows (block y: rows 8 NT y ..).
template <class S, int NT>
__global__ void __launch_bounds__(32 * kMmaWarps) k_mma(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows,
                                                        int64_t nb, const int8_t* __restrict__ q,
                                                        const float* __restrict__ dx, int T, float* __restrict__ y,
                                                        int64_t ldy) {
  prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * kMmaWarps * 16, kMmaWarps * 16);
  pdl_wait();
  __shared__ typename S::Tabs tabs;
  tabs.load();
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  const int64_t r0 = ((int64_t)blockIdx.x * kMmaWarps + (threadIdx.x >> 5)) * 16;
  if (r0 >= rows) return;  // whole warps; no barrier follows
  const int t0 = (int)blockIdx.y * 8 * NT;
  const int8_t* qb[NT];
  const float* dxc[NT][2];  // columns past T: row T - 1 (outputs unused)
  mma_act_rows<NT>(q, dx, nb, [&](int j) { return (int64_t)(t0 + j < T ? t0 + j : T - 1); }, qb, dxc);
  float out[NT][4];
  mma_rows<S, NT>(W, row_bytes, r0, rows, nb, qb, dxc, tabs, out);
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int64_t r = r0 + g + 8 * (e >> 1);
      const int t = t0 + 8 * n + 2 * c4 + (e & 1);
      if (r < rows && t < T) y[(int64_t)t * ldy + r] = out[n][e];
    }
}

// Expert tiles (k_sel_tiles), as k_iq2xxs_tiles: block (x, y) takes tiles y, y + gridDim.y, ...; warp w of block x
// takes the expert's 16-row groups x kMmaWarps + w, then + kMmaWarps gridDim.x. The tile's slots are the MMA's
// activation rows (slot / xdiv; past the count: the first slot again, outputs unused); NT = 1 for tiles of at most
// 8 slots. kPair: gate (W) and up (W2) in turn over the same slots, then y2 = up and y = silu(gate) * up.
// kStage: the tile's 8 NT activation rows and their scales are first copied into shared memory by the whole block
// (act_s: rows of cols + kActPad bytes, then dx_s), so that the MMAs' B words come from there instead of one L2
// round trip each; the same words, so the same bits. Every thread of the block calls it (kStage has a barrier).
constexpr int kActPad = 16;  // bytes after each staged row: thread (g, c4)'s words fall in bank 4 g + c4
__host__ __device__ constexpr size_t tile_stage_bytes(int NT, int64_t nb) {
  return (size_t)8 * NT * (nb * QK_K + kActPad) + (size_t)8 * NT * nb * sizeof(float);
}
constexpr size_t kTileStageMax = 100 * 1024;  // larger (rows past 6000 columns): the activations from L2
template <class S, int NT, bool kPair, bool kStage>
__device__ __forceinline__ void mma_tile(const uint8_t* We, const uint8_t* We2, size_t row_bytes, int64_t rows,
                                         int64_t nb, const int8_t* q, const float* dx, float* y, float* y2, int64_t ldy,
                                         const int32_t* xrow, const int32_t* yrow, int cnt,
                                         const typename S::Tabs& tabs, uint8_t* stage) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  const int8_t* qb[NT];
  const float* dxc[NT][2];  // columns past the count: the first slot (outputs unused)
  if constexpr (kStage) {
    const int64_t cols = nb * QK_K, ld = cols + kActPad, units = cols / 16;
    int8_t* act_s = reinterpret_cast<int8_t*>(stage);
    float* dx_s = reinterpret_cast<float*>(stage + (size_t)8 * NT * ld);
    for (int64_t i = threadIdx.x; i < 8 * NT * units; i += blockDim.x) {
      const int j = (int)(i / units);
      const int64_t o = i % units * 16, row = xrow[j < cnt ? j : 0];
      *reinterpret_cast<uint4*>(act_s + j * ld + o) = __ldg(reinterpret_cast<const uint4*>(q + row * cols + o));
    }
    for (int64_t i = threadIdx.x; i < 8 * NT * nb; i += blockDim.x) {
      const int j = (int)(i / nb);
      dx_s[i] = __ldg(dx + (int64_t)xrow[j < cnt ? j : 0] * nb + i % nb);
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < NT; n++) {
      qb[n] = act_s + (8 * n + g) * ld;
#pragma unroll
      for (int j = 0; j < 2; j++) dxc[n][j] = dx_s + (8 * n + 2 * c4 + j) * nb;
    }
  } else {
    mma_act_rows<NT>(q, dx, nb, [&](int j) { return (int64_t)xrow[j < cnt ? j : 0]; }, qb, dxc);
  }
  const int64_t step = (int64_t)16 * kMmaWarps * gridDim.x;
  for (int64_t r0 = ((int64_t)blockIdx.x * kMmaWarps + (threadIdx.x >> 5)) * 16; r0 < rows; r0 += step) {
    float out[NT][4], up[kPair ? NT : 1][4];
    mma_rows<S, NT, kStage>(We, row_bytes, r0, rows, nb, qb, dxc, tabs, out);
    if constexpr (kPair) mma_rows<S, NT, kStage>(We2, row_bytes, r0, rows, nb, qb, dxc, tabs, up);
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t r = r0 + g + 8 * (e >> 1);
        const int j = 8 * n + 2 * c4 + (e & 1);
        if (r >= rows || j >= cnt) continue;
        const int64_t o = (int64_t)yrow[j] * ldy + r;
        if constexpr (kPair) {
          y2[o] = up[n][e];
          y[o] = __fmul_rn(silu_of(out[n][e]), up[n][e]);
        } else {
          y[o] = out[n][e];
        }
      }
  }
}

// Launched twice over the same tiles: NT = 1 takes the tiles of at most 8 slots, NT = 2 the others (one NT a kernel:
// registers). ahead: while a tile's header is read, the block's rows of its next tile of this launch's kind (their
// first 16 kMmaWarps rows; W2's too) are prefetched into L2, so that the tile's first weight loads do not wait on
// DRAM (a tile is only nb blocks a row, each load waiting on the one before).
template <class S, int NT, bool kPair, bool kStage>
__global__ void __launch_bounds__(32 * kMmaWarps) k_tiles_mma(
    const uint8_t* __restrict__ W, const uint8_t* __restrict__ W2, size_t row_bytes, int64_t rows, int64_t nb,
    const int8_t* __restrict__ q, const float* __restrict__ dx, float* __restrict__ y, float* __restrict__ y2,
    int64_t ldy, size_t ebytes, size_t ebytes2, int xdiv, const int32_t* __restrict__ tile_e,
    const int32_t* __restrict__ tile_n, const int32_t* __restrict__ tile_slot, const int32_t* __restrict__ ntiles,
    bool ahead) {
  pdl_wait();
  __shared__ typename S::Tabs tabs;
  extern __shared__ __align__(16) uint8_t stage[];  // kStage: tile_stage_bytes(NT, nb)
  tabs.load();  // before over_tiles' first barrier
  const int64_t r_block = (int64_t)blockIdx.x * kMmaWarps * 16;
  auto next = [&](int tile, int nt) {
    if (!ahead || r_block >= rows) return;
    while (tile < nt && (tile_n[tile] <= 8) != (NT == 1)) tile += gridDim.y;
    if (tile >= nt) return;
    const size_t bytes = (size_t)(rows - r_block < 16 * kMmaWarps ? rows - r_block : 16 * kMmaWarps) * row_bytes;
    const size_t e = (size_t)tile_e[tile];
    pdl_prefetch(W + e * ebytes + r_block * row_bytes, bytes);
    if constexpr (kPair) pdl_prefetch(W2 + e * ebytes2 + r_block * row_bytes, bytes);
  };
  over_tiles(tile_e, tile_n, tile_slot, ntiles, xdiv, [&](int expert, int cnt, const int32_t* xrow, const int32_t* yrow) {
    if ((cnt <= 8) != (NT == 1)) return;  // the other launch's tile
    const uint8_t* We = W + (size_t)expert * ebytes;
    const uint8_t* We2 = kPair ? W2 + (size_t)expert * ebytes2 : nullptr;
    mma_tile<S, NT, kPair, kStage>(We, We2, row_bytes, rows, nb, q, dx, y, y2, ldy, xrow, yrow, cnt, tabs, stage);
  }, next);
}
