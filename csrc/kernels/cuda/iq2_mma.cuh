// IQ2_XXS products of many activation rows on the int8 tensor cores (mma.sync m16n8k16), with matmul.h's exact
// lane order. Included by matmul.cu after the IQ2_XXS tables (iq2_tables) and the tile loop (over_tiles) it uses; sm_80 and later
// (mma_available()); the caller keeps the dp4a kernels for older cards.
//
// Why this is exact. matmul.h's value of y[t][r] needs, per 256-block, the 16 integer lane sums
//   P_k = sum over the 16 values v of lane k (v mod 32 in {2k, 2k + 1}) of w[v] q[v],   w = (2 sc + 1) * grid * sign,
// then L_k = fma(d * dx, (float)P_k, L_k) over the blocks in order and reduce16's tree. The tensor core computes
// integer dot products exactly (int32 accumulators), and P_k is an integer, so any way of summing it gives the
// same P_k. One MMA per lane k: A = the 16 weight rows' 16 values of lane k (16 x 16), B = the same 16 values of 8
// activation rows (k_quantize's lane-major layout keeps them contiguous: value 32 s + 2 k + i at 16 k + 2 s + i,
// the MMA's K index 2 s + i), C = P_k for 16 rows x 8 activation rows. w needs 12 bits (|w| <= 31 * 43), so A is
// w's two bytes: w = 256 hi + lo, hi signed, lo unsigned; two MMAs (s8 x s8 and u8 x s8) and P = 256 P_hi + P_lo,
// exact in int32 (|P| <= 16 * 1333 * 127 < 2^22). Then (float)P by the 2^23 + 2^22 bias (exact for |P| < 2^22) and
// the same fma chain and tree as the dp4a kernels: the same bits (tests/test_cuda_matmul.py, bit for bit against
// the CPU's scalar kernel).
//
// Fragments (PTX ISA, mma.m16n8k16 integer): thread (g, c4) = (lane / 4, lane % 4) holds A rows g and g + 8 at K
// 4 c4 .. 4 c4 + 3 (sub-blocks 2 c4 and 2 c4 + 1 of the 256-block), B's K 4 c4 .. 4 c4 + 3 of activation row g, and
// C at rows g, g + 8 and activation rows 2 c4, 2 c4 + 1. So each thread decodes 4 sub-blocks (2 rows x 2) of each
// block once and keeps all 16 lanes of its 4 outputs per 8 activation rows: reduce16 needs no shuffle.
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

constexpr int kMmaBias = 0x4B400000;         // the bits of 2^23 + 2^22: bits + P is the float 2^23 + 2^22 + P
constexpr float kMmaBiasF = 12582912.f;      // 2^23 + 2^22

// Thread (g, c4)'s share of one IQ2_XXS block of rows g and g + 8 (i = 0, 1): sub-blocks 2 c4 + h (h = 0, 1), each
// its 4 grid indices and its sign / scale word; and the rows' d bits.
struct Iq2MmaPart {
  uint32_t idx[2][2], aux[2][2];
  uint16_t dh[2];
  __device__ __forceinline__ void load(const uint8_t* b0, const uint8_t* b1, int c4) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const uint8_t* blk = i ? b1 : b0;
      const uint8_t* p = blk + 2 + 16 * c4;  // sub-block s at blk + 2 + 8 s: even (66-byte blocks at even rows)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        idx[i][h] = u32_at2(p + 8 * h);
        aux[i][h] = u32_at2(p + 8 * h + 4);
      }
      dh[i] = __ldg(reinterpret_cast<const uint16_t*>(blk));
    }
  }
  __device__ __forceinline__ float d(int i) const { return __fmul_rn(__half2float(__ushort_as_half(dh[i])), 0.125f); }
};

// The 16-bit w of value pair m (values 2 m, 2 m + 1) of grid entry l, as a word (w0 | w1 << 16): the grid bytes
// times the scale (positive, no carry between the halves), then negated per half where the sign bit is set
// ((x ^ 0xffff) + 1: no carry out, x >= 8).
__device__ __forceinline__ uint32_t iq2_pair16(uint32_t gw, uint32_t mw, int m, uint32_t ls) {
  const uint32_t gp = __byte_perm(gw, 0, (m & 1) ? 0x4342 : 0x4140);
  const uint32_t mm = __byte_perm(mw, 0, (m & 1) ? 0x3322 : 0x1100);
  return ((gp * ls) ^ mm) + (mm & 0x00010001u);
}

// Grid entry l of thread (g, c4)'s share of a block (cur), as the MMA's A fragments of lanes k = 4 l + m: a[m] =
// (lo of row g, lo of row g + 8, hi of row g, hi of row g + 8), each 4 bytes at K 4 c4 .. 4 c4 + 3.
__device__ __forceinline__ void iq2_mma_frags(const Iq2MmaPart& cur, int l, const uint64_t* grid,
                                              const uint64_t* smask, uint4 (&a)[4]) {
  uint32_t wp[2][2][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint64_t gv = grid[(cur.idx[i][h] >> (8 * l)) & 255];
      const uint64_t mk = smask[(cur.aux[i][h] >> (7 * l)) & 127];
      const uint32_t ls = 2 * (cur.aux[i][h] >> 28) + 1;
#pragma unroll
      for (int m = 0; m < 4; m++)
        wp[i][h][m] = iq2_pair16(m < 2 ? (uint32_t)gv : (uint32_t)(gv >> 32),
                                 m < 2 ? (uint32_t)mk : (uint32_t)(mk >> 32), m, ls);
    }
#pragma unroll
  for (int m = 0; m < 4; m++)
    a[m] = make_uint4(__byte_perm(wp[0][0][m], wp[0][1][m], 0x6420), __byte_perm(wp[1][0][m], wp[1][1][m], 0x6420),
                      __byte_perm(wp[0][0][m], wp[0][1][m], 0x7531), __byte_perm(wp[1][0][m], wp[1][1][m], 0x7531));
}

// The warp's 16 weight rows r0 .. r0 + 15 of W (rows past `rows` read row rows - 1, their outputs unused) against
// NT x 8 activation rows: thread (g, c4)'s B rows qb[n] (activation row 8 n + g; q of block 0) and its C rows' dx
// (dxc[n][j]: activation row 8 n + 2 c4 + j). out[n][e]: the finished value (matmul.h's y) of weight row
// r0 + g + 8 (e >> 1) and activation row 8 n + 2 c4 + (e & 1).
// An activation word or scale: from global memory (read-only path) or, kShared, from shared memory.
template <bool kShared, class V>
__device__ __forceinline__ V act_load(const V* p) {
  if constexpr (kShared) return *p;
  else return __ldg(p);
}

template <int NT, bool kSharedAct = false>
__device__ __forceinline__ void iq2_mma_rows(const uint8_t* __restrict__ W, size_t row_bytes, int64_t r0,
                                             int64_t rows, int64_t nb, const int8_t* const (&qb)[NT],
                                             const float* const (&dxc)[NT][2], const uint64_t* grid,
                                             const uint64_t* smask, float (&out)[NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  const uint8_t* row0 = W + (r0 + g < rows ? r0 + g : rows - 1) * row_bytes;
  const uint8_t* row1 = W + (r0 + g + 8 < rows ? r0 + g + 8 : rows - 1) * row_bytes;
  float L[NT][4][16];
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
      for (int k = 0; k < 16; k++) L[n][e][k] = 0.f;
  Iq2MmaPart part;
  part.load(row0, row1, c4);
  for (int64_t b = 0; b < nb; b++) {
    const Iq2MmaPart cur = part;
    if (b + 1 < nb) part.load(row0 + (b + 1) * IQ2_XXS::kBytes, row1 + (b + 1) * IQ2_XXS::kBytes, c4);
    float dd[NT][4];
    {
      const float d0 = cur.d(0), d1 = cur.d(1);
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const float dxv = act_load<kSharedAct>(dxc[n][j] + b);
          dd[n][j] = __fmul_rn(d0, dxv);
          dd[n][2 + j] = __fmul_rn(d1, dxv);
        }
    }
#pragma unroll
    for (int l = 0; l < 4; l++) {  // grid entry l: lanes 4 l .. 4 l + 3
      uint4 a[4];
      iq2_mma_frags(cur, l, grid, smask, a);
#pragma unroll
      for (int m = 0; m < 4; m++) {
        const int k = 4 * l + m;
        const uint32_t lo0 = a[m].x, lo1 = a[m].y, hi0 = a[m].z, hi1 = a[m].w;
#pragma unroll
        for (int n = 0; n < NT; n++) {
          const uint32_t bq = act_load<kSharedAct>(reinterpret_cast<const uint32_t*>(qb[n] + b * QK_K + 16 * k + 4 * c4));
          int plo[4], phi[4];
          mma_k16<true>(plo, lo0, lo1, bq, kMmaBias);
          mma_k16<false>(phi, hi0, hi1, bq, 0);
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const float p = __fsub_rn(__int_as_float(phi[e] * 256 + plo[e]), kMmaBiasF);  // (float)P, exact
            L[n][e][k] = fmaf(dd[n][e], p, L[n][e][k]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) out[n][e] = __fsub_rn(tree16(L[n][e]), 0.f);  // k_int's y = s - Lm, Lm = 0
}

constexpr int kMmaWarps = 4;  // warps a block: each 16 weight rows

// Thread (g, c4)'s activation rows for iq2_mma_rows: qb[n] for MMA column 8 n + g (B) and dxc[n][j] for columns
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
template <int NT>
__global__ void __launch_bounds__(32 * kMmaWarps) k_iq2xxs_mma(const uint8_t* __restrict__ W, size_t row_bytes,
                                                               int64_t rows, int64_t nb, const int8_t* __restrict__ q,
                                                               const float* __restrict__ dx, int T,
                                                               float* __restrict__ y, int64_t ldy) {
  prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * kMmaWarps * 16, kMmaWarps * 16);
  pdl_wait();
  __shared__ uint64_t grid[256];
  __shared__ uint64_t smask[128];
  iq2_tables(grid, smask);
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  const int64_t r0 = ((int64_t)blockIdx.x * kMmaWarps + (threadIdx.x >> 5)) * 16;
  if (r0 >= rows) return;  // whole warps; no barrier follows
  const int t0 = (int)blockIdx.y * 8 * NT;
  const int8_t* qb[NT];
  const float* dxc[NT][2];  // columns past T: row T - 1 (outputs unused)
  mma_act_rows<NT>(q, dx, nb, [&](int j) { return (int64_t)(t0 + j < T ? t0 + j : T - 1); }, qb, dxc);
  float out[NT][4];
  iq2_mma_rows<NT>(W, row_bytes, r0, rows, nb, qb, dxc, grid, smask, out);
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int64_t r = r0 + g + 8 * (e >> 1);
      const int t = t0 + 8 * n + 2 * c4 + (e & 1);
      if (r < rows && t < T) y[(int64_t)t * ldy + r] = out[n][e];
    }
}

// Dense rows of a prompt piece (kPanelMinT activation rows or more): a block's 16 weight rows decoded once into
// shared memory as the MMA's A fragments, then every activation row of the block's range taken 8 at a time from
// there. iq2_mma_rows decodes the weights again for every 16 activation rows and holds 16 lanes x 4 outputs x 16
// activation rows of sums (237 registers: 2 blocks of 4 warps an SM); here the decode is paid once per 16 weight
// rows and range, and a warp holds 16 lanes x 4 outputs of 8 activation rows. Each output's integers P_k, its
// fma chain over the blocks in order and reduce16's tree are iq2_mma_rows' (the same bits).
// Shared memory: frag[b][k][lane] = (lo0, lo1, hi0, hi1), the A fragments of lane k of block b for thread `lane`
// (rows g and g + 8), 8 KB a block of 16 rows; then the rows' d of each block, dsm[b][row].
constexpr int kPanelWarps = 8;
constexpr int kPanelMinT = 32;                 // fewer rows: k_iq2xxs_mma
constexpr size_t kPanelMaxSmem = 160 * 1024;   // IQ2_XXS rows of up to 4864 columns (the 80B file's: 2048, 4096)
__host__ __device__ constexpr size_t panel_smem_bytes(int64_t nb) {
  return (size_t)nb * (16 * 32 * sizeof(uint4) + 16 * sizeof(float));
}

// The panels' prologue: the IQ2_XXS tables into grid / smask, then the decode of rows r0 .. r0 + 15 (warp w takes
// blocks w, w + kPanelWarps, ...; thread (g, c4) rows r0 + g and r0 + g + 8, sub-blocks 2 c4 + h) into
// frag[b][k][lane] and dsm[b][row] (k_iq2xxs_panel's layout). Every thread of the block calls it (it has barriers:
// the panel is whole when it returns).
__device__ __forceinline__ void panel_decode(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows, int64_t nb,
                                             int64_t r0, uint64_t* grid, uint64_t* smask, uint4* frag, float* dsm) {
  iq2_tables(grid, smask);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
  const uint8_t* row0 = W + (r0 + g < rows ? r0 + g : rows - 1) * row_bytes;
  const uint8_t* row1 = W + (r0 + g + 8 < rows ? r0 + g + 8 : rows - 1) * row_bytes;
  for (int64_t b = warp; b < nb; b += kPanelWarps) {
    Iq2MmaPart cur;
    cur.load(row0 + b * IQ2_XXS::kBytes, row1 + b * IQ2_XXS::kBytes, c4);
    if (c4 == 0) {
      dsm[b * 16 + g] = cur.d(0);
      dsm[b * 16 + g + 8] = cur.d(1);
    }
#pragma unroll
    for (int l = 0; l < 4; l++) {
      uint4 a[4];
      iq2_mma_frags(cur, l, grid, smask, a);
#pragma unroll
      for (int m = 0; m < 4; m++) frag[(b * 16 + 4 * l + m) * 32 + lane] = a[m];
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(32 * kPanelWarps) k_iq2xxs_panel(const uint8_t* __restrict__ W, size_t row_bytes,
                                                                   int64_t rows, int64_t nb,
                                                                   const int8_t* __restrict__ q,
                                                                   const float* __restrict__ dx, int T,
                                                                   int tiles_per_y, float* __restrict__ y,
                                                                   int64_t ldy) {
  prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * 16, 16);
  pdl_wait();
  __shared__ uint64_t grid[256];
  __shared__ uint64_t smask[128];
  extern __shared__ uint4 frag[];  // [nb][16][32]
  float* dsm = reinterpret_cast<float*>(frag + nb * 16 * 32);  // [nb][16]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
  const int64_t r0 = (int64_t)blockIdx.x * 16;
  panel_decode(W, row_bytes, rows, nb, r0, grid, smask, frag, dsm);
  // the activation rows: tiles of 8 (tile_0 .. tile_0 + tiles_per_y of this block y), warp w taking every
  // kPanelWarps-th
  const int tile0 = (int)blockIdx.y * tiles_per_y, tiles = (T + 7) / 8;
  const int tile1 = tile0 + tiles_per_y < tiles ? tile0 + tiles_per_y : tiles;
  for (int tile = tile0 + warp; tile < tile1; tile += kPanelWarps) {
    const int t0 = tile * 8;
    auto col = [&](int j) { return (int64_t)(t0 + j < T ? t0 + j : T - 1); };  // past T: row T - 1, unused
    const int8_t* qb = q + col(g) * nb * QK_K + 4 * c4;
    const float* dx0 = dx + col(2 * c4) * nb;
    const float* dx1 = dx + col(2 * c4 + 1) * nb;
    float L[4][16];
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
      for (int k = 0; k < 16; k++) L[e][k] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
      float dd[4];
      {
        const float d0 = dsm[b * 16 + g], d1 = dsm[b * 16 + g + 8];
        const float x0 = __ldg(dx0 + b), x1 = __ldg(dx1 + b);
        dd[0] = __fmul_rn(d0, x0);
        dd[1] = __fmul_rn(d0, x1);
        dd[2] = __fmul_rn(d1, x0);
        dd[3] = __fmul_rn(d1, x1);
      }
      uint32_t bq[16];
#pragma unroll
      for (int k = 0; k < 16; k++) bq[k] = __ldg(reinterpret_cast<const uint32_t*>(qb + b * QK_K + 16 * k));
#pragma unroll
      for (int k = 0; k < 16; k++) {
        const uint4 a = frag[(b * 16 + k) * 32 + lane];
        int plo[4], phi[4];
        mma_k16<true>(plo, a.x, a.y, bq[k], kMmaBias);
        mma_k16<false>(phi, a.z, a.w, bq[k], 0);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float p = __fsub_rn(__int_as_float(phi[e] * 256 + plo[e]), kMmaBiasF);  // (float)P, exact
          L[e][k] = fmaf(dd[e], p, L[e][k]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {  // reduce16's tree, then k_int's y = s - Lm with Lm = 0
      const float v = __fsub_rn(tree16(L[e]), 0.f);
      const int64_t r = r0 + g + 8 * (e >> 1);
      const int t = t0 + 2 * c4 + (e & 1);
      if (r < rows && t < T) y[(int64_t)t * ldy + r] = v;
    }
  }
}

// k_iq2xxs_panel with each warp's activation rows staged: a warp takes tiles of 16 activation rows (two MMA column
// groups, so that each A fragment read from shared memory serves 16 rows, not 8) and copies each 256-value block of
// its 16 rows, with their scales, into a ring of kPanelStages buffers in shared memory by cp.async one block ahead
// (16-byte copies, whole sectors: k_iq2xxs_panel's 4-byte loads of 8 rows used half of each sector, and the L1 was
// its limit: 97 % busy in ncu, H100), then reads the MMAs' B words from there with ldmatrix (rows padded to 272
// bytes: the 8 rows of a matrix fall in distinct banks). The same A fragments, B words and scales as
// k_iq2xxs_panel, the same P_k, fma chains over the blocks in order and reduce16's tree: the same bits.
constexpr int kPanelStages = 2;
constexpr int kPanelActLd = QK_K + 16;  // bytes a staged activation row
constexpr size_t kPanelStageBytes = 16 * kPanelActLd + 16 * sizeof(float);  // 16 rows of one block, then their dx
constexpr size_t kPanelStagedMaxSmem = 220 * 1024;
__host__ __device__ constexpr size_t panel_staged_smem_bytes(int64_t nb) {
  return panel_smem_bytes(nb) + (size_t)kPanelWarps * kPanelStages * kPanelStageBytes;
}

// ldmatrix (sm_80 and later: the host launches its kernel only where mma_available()); the cp.async copies are
// async_copy.cuh's.
// Four 8 x 8 matrices of 16-bit words (ldmatrix .x4): thread t gives the address of row t % 8 of matrix t / 8 and
// gets in r[i] the 32-bit word (t % 4) of row t / 4 of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((uint32_t)__cvta_generic_to_shared(row)));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

__global__ void __launch_bounds__(32 * kPanelWarps, 1) k_iq2xxs_panel_staged(
    const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows, int64_t nb, const int8_t* __restrict__ q,
    const float* __restrict__ dx, int T, int tiles_per_y, float* __restrict__ y, int64_t ldy) {
  prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * 16, 16);
  pdl_wait();
  __shared__ uint64_t grid[256];
  __shared__ uint64_t smask[128];
  extern __shared__ uint4 frag[];  // [nb][16][32], then dsm [nb][16], then the warps' rings
  float* dsm = reinterpret_cast<float*>(frag + nb * 16 * 32);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
  const int64_t r0 = (int64_t)blockIdx.x * 16;
  panel_decode(W, row_bytes, rows, nb, r0, grid, smask, frag, dsm);
  uint8_t* ring = reinterpret_cast<uint8_t*>(dsm + nb * 16) + (size_t)warp * kPanelStages * kPanelStageBytes;
  const int tile0 = (int)blockIdx.y * tiles_per_y, tiles = (T + 15) / 16;
  const int tile1 = tile0 + tiles_per_y < tiles ? tile0 + tiles_per_y : tiles;
  for (int tile = tile0 + warp; tile < tile1; tile += kPanelWarps) {
    const int t0 = tile * 16;
    auto src = [&](int j) { return (int64_t)(t0 + j < T ? t0 + j : T - 1); };  // past T: row T - 1, unused
    // block b of the 16 rows into buffer s: 256 copies of 16 bytes (lane + 32 i: row c / 16, bytes 16 (c % 16)),
    // and lanes 0..15 the rows' dx
    auto fetch = [&](int64_t b, int s) {
      uint8_t* buf = ring + s * kPanelStageBytes;
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const int c = lane + 32 * i, row = c >> 4, off = (c & 15) * 16;
        cp_async16(buf + row * kPanelActLd + off, q + (src(row) * nb + b) * QK_K + off);
      }
      if (lane < 16) cp_async4(buf + 16 * kPanelActLd + 4 * lane, dx + src(lane) * nb + b);
      cp_async_commit();
    };
    float L[2][4][16];
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++)
#pragma unroll
        for (int k = 0; k < 16; k++) L[n][e][k] = 0.f;
    fetch(0, 0);
    for (int64_t b = 0; b < nb; b++) {
      if (b + 1 < nb) {
        fetch(b + 1, (int)((b + 1) % kPanelStages));
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncwarp();  // every lane's copies of block b are in
      const uint8_t* buf = ring + (b % kPanelStages) * kPanelStageBytes;
      const float* dxs = reinterpret_cast<const float*>(buf + 16 * kPanelActLd);
      float dd[2][4];
      {
        const float d0 = dsm[b * 16 + g], d1 = dsm[b * 16 + g + 8];
#pragma unroll
        for (int n = 0; n < 2; n++) {
          const float x0 = dxs[8 * n + 2 * c4], x1 = dxs[8 * n + 2 * c4 + 1];
          dd[n][0] = __fmul_rn(d0, x0);
          dd[n][1] = __fmul_rn(d0, x1);
          dd[n][2] = __fmul_rn(d1, x0);
          dd[n][3] = __fmul_rn(d1, x1);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; j++) {  // lanes k = 4 j .. 4 j + 3
        uint32_t bq[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) ldmatrix_x4(bq[n], buf + (8 * n + (lane & 7)) * kPanelActLd + 16 * (4 * j + (lane >> 3)));
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int k = 4 * j + i;
          const uint4 a = frag[(b * 16 + k) * 32 + lane];
#pragma unroll
          for (int n = 0; n < 2; n++) {
            int plo[4], phi[4];
            mma_k16<true>(plo, a.x, a.y, bq[n][i], kMmaBias);
            mma_k16<false>(phi, a.z, a.w, bq[n][i], 0);
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const float p = __fsub_rn(__int_as_float(phi[e] * 256 + plo[e]), kMmaBiasF);  // (float)P, exact
              L[n][e][k] = fmaf(dd[n][e], p, L[n][e][k]);
            }
          }
        }
      }
      __syncwarp();  // every lane's reads of buffer b % kPanelStages are done before it is filled again
    }
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {  // reduce16's tree, then k_int's y = s - Lm with Lm = 0
        const float v = __fsub_rn(tree16(L[n][e]), 0.f);
        const int64_t r = r0 + g + 8 * (e >> 1);
        const int t = t0 + 8 * n + 2 * c4 + (e & 1);
        if (r < rows && t < T) y[(int64_t)t * ldy + r] = v;
      }
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
template <int NT, bool kPair, bool kStage>
__device__ __forceinline__ void iq2_mma_tile(const uint8_t* We, const uint8_t* We2, size_t row_bytes, int64_t rows,
                                             int64_t nb, const int8_t* q, const float* dx, float* y, float* y2,
                                             int64_t ldy, const int32_t* xrow, const int32_t* yrow, int cnt,
                                             const uint64_t* grid, const uint64_t* smask, uint8_t* stage) {
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
    iq2_mma_rows<NT, kStage>(We, row_bytes, r0, rows, nb, qb, dxc, grid, smask, out);
    if constexpr (kPair) iq2_mma_rows<NT, kStage>(We2, row_bytes, r0, rows, nb, qb, dxc, grid, smask, up);
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
template <int NT, bool kPair, bool kStage>
__global__ void __launch_bounds__(32 * kMmaWarps) k_iq2xxs_tiles_mma(
    const uint8_t* __restrict__ W, const uint8_t* __restrict__ W2, size_t row_bytes, int64_t rows, int64_t nb,
    const int8_t* __restrict__ q, const float* __restrict__ dx, float* __restrict__ y, float* __restrict__ y2,
    int64_t ldy, size_t ebytes, size_t ebytes2, int xdiv, const int32_t* __restrict__ tile_e,
    const int32_t* __restrict__ tile_n, const int32_t* __restrict__ tile_slot, const int32_t* __restrict__ ntiles,
    bool ahead) {
  pdl_wait();
  __shared__ uint64_t grid[256];
  __shared__ uint64_t smask[128];
  extern __shared__ __align__(16) uint8_t stage[];  // kStage: tile_stage_bytes(NT, nb)
  iq2_tables(grid, smask);
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
    iq2_mma_tile<NT, kPair, kStage>(We, We2, row_bytes, rows, nb, q, dx, y, y2, ldy, xrow, yrow, cnt, grid, smask,
                                     stage);
  }, next);
}
