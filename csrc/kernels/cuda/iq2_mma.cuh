// IQ2_XXS on the int8 tensor cores: its MMA source for mma.cuh's kernels (Iq2Mma: the A fragments of its blocks)
// and the dense prompt pieces' panels (k_iq2xxs_panel, k_iq2xxs_panel_staged: 16 weight rows decoded once into shared
// memory). Included by matmul.cu after the IQ2_XXS tables (iq2_tables) and mma.cuh; sm_80 and later
// (mma_available()); the caller keeps the dp4a kernels for older cards. Why the MMA products are exact, and the
// fragments' layout: mma.cuh. IQ2_XXS's w = (2 sc + 1) grid sign needs 12 bits (|w| <= 31 * 43), so
// |P| <= 16 * 1333 * 127 < 2^22: the bias conversion.
// No namespace of its own: it is included inside matmul.cu's (anonymous, in strata::cuda).
#pragma once

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

// The MMA source of IQ2_XXS (mma.cuh): the grids and sign masks in shared memory.
struct Iq2Mma {
  static constexpr int kBytes = IQ2_XXS::kBytes;
  static constexpr bool kMins = false, kBiasP = true, kAhead = true;  // |P| <= 16 * 1333 * 127 < 2^22
  struct Tabs {
    uint64_t grid[256];
    uint64_t smask[128];
    __device__ __forceinline__ void load() { iq2_tables(grid, smask); }
  };
  using Part = Iq2MmaPart;
  static __device__ __forceinline__ void frags(const Part& p, int l, const Tabs& t, uint4 (&a)[4]) {
    iq2_mma_frags(p, l, t.grid, t.smask, a);
  }
};

// Dense rows of a prompt piece (kPanelMinT activation rows or more): a block's 16 weight rows decoded once into
// shared memory as the MMA's A fragments, then every activation row of the block's range taken 8 at a time from
// there. mma_rows decodes the weights again for every 16 activation rows and holds 16 lanes x 4 outputs x 16
// activation rows of sums (237 registers: 2 blocks of 4 warps an SM); here the decode is paid once per 16 weight
// rows and range, and a warp holds 16 lanes x 4 outputs of 8 activation rows. Each output's integers P_k, its
// fma chain over the blocks in order and reduce16's tree are mma_rows' (the same bits).
// Shared memory: frag[b][k][lane] = (lo0, lo1, hi0, hi1), the A fragments of lane k of block b for thread `lane`
// (rows g and g + 8), 8 KB a block of 16 rows; then the rows' d of each block, dsm[b][row].
constexpr int kPanelWarps = 8;
constexpr int kPanelMinT = 32;                 // fewer rows: k_mma<Iq2Mma>
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
