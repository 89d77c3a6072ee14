// matmul.h's 16 lanes held in one thread's registers (l[j]: the lane sum of the columns c = j (mod 16)), for the
// kernels that keep every lane of a product in one thread: the tiled attention scores and float products
// (attend.cu, matmul.cu) and the IQ2_XXS tensor-core kernels (iq2_mma.cuh). One copy of the tree and of the tiles'
// inner step, so that each keeps dot16's / reduce16's order by construction. And dot16 over a warp (dot16_warp: the
// per-row norms of layers.cu and matmul.cu).
#pragma once
#include <cstdint>

namespace strata::cuda {

// dot16's and reduce16's tree: s8[j] = l[j] + l[j + 8], s4[j] = s8[j] + s8[j + 4], then (s4[0] + s4[2]) +
// (s4[1] + s4[3]).
__device__ __forceinline__ float tree16(const float (&l)[16]) {
  float s8[8], s4[4];
#pragma unroll
  for (int j = 0; j < 8; j++) s8[j] = __fadd_rn(l[j], l[j + 8]);
#pragma unroll
  for (int j = 0; j < 4; j++) s4[j] = __fadd_rn(s8[j], s8[j + 4]);
  return __fadd_rn(__fadd_rn(s4[0], s4[2]), __fadd_rn(s4[1], s4[3]));
}

// ops.h dot16(a, b, n) over one warp: lane j < 16 sums i = j (mod 16) in increasing i, then the fixed tree; every
// lane gets the value.
__device__ __forceinline__ float dot16_warp(const float* a, const float* b, int64_t n) {
  const int lane = threadIdx.x & 31;
  float l = 0.f;
  if (lane < 16)
    for (int64_t i = lane; i < n; i += 16) l = __fadd_rn(l, __fmul_rn(a[i], b[i]));
  const float s8 = __fadd_rn(l, __shfl_down_sync(0xffffffffu, l, 8));
  const float s4 = __fadd_rn(s8, __shfl_down_sync(0xffffffffu, s8, 4));
  const float s4_0 = __shfl_sync(0xffffffffu, s4, 0), s4_1 = __shfl_sync(0xffffffffu, s4, 1),
              s4_2 = __shfl_sync(0xffffffffu, s4, 2), s4_3 = __shfl_sync(0xffffffffu, s4, 3);
  return __fadd_rn(__fadd_rn(s4_0, s4_2), __fadd_rn(s4_1, s4_3));
}
// ops.h rmsnorm's scale of a row of n over one warp: 1 / sqrt(dot16(x, x) / n + eps) (the per-head norms: gated
// norm, q / k norm).
__device__ __forceinline__ float rms_scale_warp(const float* x, int64_t n, float eps) {
  return __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(dot16_warp(x, x, n), (float)n), eps)));
}

// One 16-column group of a tile held in shared memory (rows of ld floats): for the thread's rows ra, ra + 16 of A
// and rb, rb + 16 of B, columns j0 .. j0 + 15 (j0 % 16 == 0 counted from a 16-aligned column) go into lane
// (column % 16) of l[x][y], in increasing column order: l = fma(b, a, l) (kFma: k_float's lanes) or l + a * b
// rounded twice (dot16's lanes).
template <bool kFma>
__device__ __forceinline__ void pairs16(float (&l)[2][2][16], const float* as, const float* bs, int ld, int ra, int rb,
                                        int j0) {
#pragma unroll
  for (int j = j0; j < j0 + 16; j += 4) {
    float av[2][4], bv[2][4];
#pragma unroll
    for (int x = 0; x < 2; x++) {
      const float4 f = *reinterpret_cast<const float4*>(as + (ra + 16 * x) * ld + j);
      av[x][0] = f.x, av[x][1] = f.y, av[x][2] = f.z, av[x][3] = f.w;
      const float4 g = *reinterpret_cast<const float4*>(bs + (rb + 16 * x) * ld + j);
      bv[x][0] = g.x, bv[x][1] = g.y, bv[x][2] = g.z, bv[x][3] = g.w;
    }
#pragma unroll
    for (int x = 0; x < 2; x++)
#pragma unroll
      for (int y = 0; y < 2; y++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float& acc = l[x][y][(j + e) & 15];
          acc = kFma ? fmaf(bv[y][e], av[x][e], acc) : __fadd_rn(acc, __fmul_rn(av[x][e], bv[y][e]));
        }
  }
}

}  // namespace strata::cuda
