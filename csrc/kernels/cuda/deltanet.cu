// DeltaNet rows on the card (ops_cuda.h dn_rows): one thread per column j of S. Column j of S only ever meets
// column j of v, m and o (deltanet_state.h), so each thread runs all T rows over its own column with exactly the
// CPU's per-element operations in the CPU's order (dn_decay_delta, then dn_update / dn_update_read; increasing a,
// no contraction), and the result equals dn_rows_ref (and every CPU path) bit for bit. For dk = 64 the column
// stays in one thread's registers through the window (read once, written once), for dk = 128 in two threads'
// (k_dn_rows_split); other dk run on memory.
#include <cuda_runtime.h>

#include <stdexcept>

#include "backend/backend.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "util/common.h"

namespace strata::cuda {

namespace {

constexpr int kRowsPerLaunch = 32;  // rows passed by value per launch (longer windows: several launches)
struct DnLaunch {
  DnRow rows[kRowsPerLaunch];
};

// Rows 0..T-1 of L start on `S0`; at row `sw` (if < T) the column is copied from S0 to S_work and the rest run on
// S_work (S0 keeps the state after rows 0..sw-1). DK > 0: the column in registers; DK == 0: in memory (dk rows).
template <int DK>
__global__ void __launch_bounds__(32) k_dn_rows(float* __restrict__ S0, float* __restrict__ S_work,
                                                const __grid_constant__ DnLaunch L, int T, int sw, int64_t dk,
                                                int64_t dv) {
  pdl_wait();
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= dv) return;
  constexpr int kReg = DK > 0 ? DK : 1;
  float s[kReg];
  float* Sc = S0;
  if constexpr (DK > 0) {
#pragma unroll
    for (int a = 0; a < DK; a++) s[a] = S0[a * dv + j];
  }
  for (int t = 0; t < T; t++) {
    if (t == sw) {  // the working copy starts from this column of S as it stands now
      if constexpr (DK > 0) {
#pragma unroll
        for (int a = 0; a < DK; a++) S0[a * dv + j] = s[a];
      } else {
        for (int64_t a = 0; a < dk; a++) S_work[a * dv + j] = S0[a * dv + j];
      }
      Sc = S_work;
    }
    const DnRow& R = L.rows[t];
    const float eg = R.eg, beta = R.beta;
    float m = 0.f;
    if constexpr (DK > 0) {
#pragma unroll
      for (int a = 0; a < DK; a++) {
        s[a] = __fmul_rn(s[a], eg);
        m = __fadd_rn(m, __fmul_rn(s[a], __ldg(R.k + a)));
      }
    } else {
      for (int64_t a = 0; a < dk; a++) {
        const float x = __fmul_rn(Sc[a * dv + j], eg);
        Sc[a * dv + j] = x;
        m = __fadd_rn(m, __fmul_rn(x, __ldg(R.k + a)));
      }
    }
    m = __fmul_rn(__fsub_rn(__ldg(R.v + j), m), beta);
    float o = 0.f;
    const bool read = R.o != nullptr;
    if constexpr (DK > 0) {
#pragma unroll
      for (int a = 0; a < DK; a++) {
        s[a] = __fadd_rn(s[a], __fmul_rn(__ldg(R.k + a), m));
        if (read) o = __fadd_rn(o, __fmul_rn(s[a], __ldg(R.q + a)));
      }
    } else {
      for (int64_t a = 0; a < dk; a++) {
        const float x = __fadd_rn(Sc[a * dv + j], __fmul_rn(__ldg(R.k + a), m));
        Sc[a * dv + j] = x;
        if (read) o = __fadd_rn(o, __fmul_rn(x, __ldg(R.q + a)));
      }
    }
    if (read) R.o[j] = o;
  }
  if constexpr (DK > 0) {
#pragma unroll
    for (int a = 0; a < DK; a++) Sc[a * dv + j] = s[a];
  }
}

// dk = 128: two threads per column (lanes j and j + 16 of a warp), each holding 64 rows of it in registers (one
// thread holding all 128 spilled). The running sums m and o keep the CPU's order: the upper half continues the
// lower half's sum (passed by a shuffle), so m = ((0 + x_0) + x_1) ... + x_127 exactly as one thread would add.
template <int DK>
__global__ void __launch_bounds__(32) k_dn_rows_split(float* __restrict__ S0, float* __restrict__ S_work,
                                                      const __grid_constant__ DnLaunch L, int T, int sw, int64_t dv) {
  pdl_wait();
  constexpr int H = DK / 2;
  const int lane = threadIdx.x, half = lane >> 4, lo = lane & 15;
  const int64_t j = (int64_t)blockIdx.x * 16 + lo;
  const bool valid = j < dv;
  const int a0 = half * H;
  float s[H];
#pragma unroll
  for (int i = 0; i < H; i++) s[i] = valid ? S0[(a0 + i) * dv + j] : 0.f;
  float* Sc = S0;
  for (int t = 0; t < T; t++) {
    if (t == sw) {  // the working copy starts from this column of S as it stands now
      if (valid)
#pragma unroll
        for (int i = 0; i < H; i++) S0[(a0 + i) * dv + j] = s[i];
      Sc = S_work;
    }
    const DnRow& R = L.rows[t];
    const float eg = R.eg, beta = R.beta;
    const float* k = R.k + a0;
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fmul_rn(s[i], eg);
      m = __fadd_rn(m, __fmul_rn(s[i], __ldg(k + i)));
    }
    const float m_lo = __shfl_sync(0xffffffffu, m, lo);  // the lower half's sum, to both halves
    if (half == 1) {
      m = m_lo;
#pragma unroll
      for (int i = 0; i < H; i++) m = __fadd_rn(m, __fmul_rn(s[i], __ldg(k + i)));
    }
    m = __shfl_sync(0xffffffffu, m, lo + 16);  // the whole sum, from the upper half
    m = __fmul_rn(__fsub_rn(valid ? __ldg(R.v + j) : 0.f, m), beta);
    const bool read = R.o != nullptr;
    float o = 0.f;
    const float* q = R.q + a0;
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(__ldg(k + i), m));
      if (read) o = __fadd_rn(o, __fmul_rn(s[i], __ldg(q + i)));
    }
    if (read) {
      const float o_lo = __shfl_sync(0xffffffffu, o, lo);
      if (half == 1) {
        o = o_lo;
#pragma unroll
        for (int i = 0; i < H; i++) o = __fadd_rn(o, __fmul_rn(s[i], __ldg(q + i)));
        if (valid) R.o[j] = o;
      }
    }
  }
  if (valid)
#pragma unroll
    for (int i = 0; i < H; i++) Sc[(a0 + i) * dv + j] = s[i];
}

}  // namespace

void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv, void* stream) {
  STRATA_CHECK(T >= 1 && n_src >= 0 && (n_src >= T || S_work), "dn_rows: T = ", T, ", n_src = ", n_src);
  STRATA_CHECK(dk >= 1 && dv >= 1, "dn_rows: dk = ", dk, ", dv = ", dv);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const dim3 grid((unsigned)((dv + 31) / 32));
  for (int t0 = 0; t0 < T; t0 += kRowsPerLaunch) {
    const int n = T - t0 < kRowsPerLaunch ? T - t0 : kRowsPerLaunch;
    DnLaunch L;
    for (int i = 0; i < n; i++) L.rows[i] = rows[t0 + i];
    // this launch starts on S unless the switch to S_work came in an earlier launch (t0 == n_src: it comes at
    // this launch's first row, and S_work is still to be made)
    float* S0 = t0 <= n_src ? S : S_work;
    const int sw = t0 <= n_src ? (n_src - t0 < n ? n_src - t0 : n) : n;
    if (dk == 128) launch(k_dn_rows_split<128>, (unsigned)((dv + 15) / 16), 32, 0, st, S0, S_work, L, n, sw, dv);
    else if (dk == 64) launch(k_dn_rows<64>, grid, 32, 0, st, S0, S_work, L, n, sw, dk, dv);
    else launch(k_dn_rows<0>, grid, 32, 0, st, S0, S_work, L, n, sw, dk, dv);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the dn_rows kernel: ", cudaGetErrorString(e));
  }
}


namespace {

// dn_heads: every value head of a layer in one launch (blockIdx.y = head h), the rows read from backend memory
// through the DnHeads strides (eg and beta too). The per-column operations are k_dn_rows' / k_dn_rows_split's.
struct HeadRow {
  const float *k, *v, *q;
  float eg, beta;
  float* o;
};
__device__ __forceinline__ HeadRow head_row(const DnHeads& a, int64_t h, int t) {
  const int64_t g = h / (a.nv / a.nk);
  return {a.k + t * a.ldk + g * a.dk, a.v + t * a.ldv + h * a.dv, a.q ? a.q + t * a.ldq + g * a.dk : nullptr,
          a.eg[t * a.nv + h], a.beta[t * a.nv + h], a.o ? a.o + t * a.ldo + h * a.dv : nullptr};
}

template <int DK>
__global__ void __launch_bounds__(32) k_dn_heads(float* __restrict__ S, float* __restrict__ S_work,
                                                 const __grid_constant__ DnHeads A, int T, int n_src) {
  pdl_wait();
  const int64_t h = blockIdx.y, dk = A.dk, dv = A.dv;
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= dv) return;
  float* S0 = S + h * dk * dv;
  float* Sw = S_work ? S_work + h * dk * dv : nullptr;
  constexpr int kReg = DK > 0 ? DK : 1;
  float s[kReg];
  float* Sc = S0;
  if constexpr (DK > 0) {
#pragma unroll
    for (int a = 0; a < DK; a++) s[a] = S0[a * dv + j];
  }
  for (int t = 0; t < T; t++) {
    if (t == n_src) {  // the working copy starts from this column of S as it stands now
      if constexpr (DK > 0) {
#pragma unroll
        for (int a = 0; a < DK; a++) S0[a * dv + j] = s[a];
      } else {
        for (int64_t a = 0; a < dk; a++) Sw[a * dv + j] = S0[a * dv + j];
      }
      Sc = Sw;
    }
    const HeadRow R = head_row(A, h, t);
    float m = 0.f;
    if constexpr (DK > 0) {
#pragma unroll
      for (int a = 0; a < DK; a++) {
        s[a] = __fmul_rn(s[a], R.eg);
        m = __fadd_rn(m, __fmul_rn(s[a], __ldg(R.k + a)));
      }
    } else {
      for (int64_t a = 0; a < dk; a++) {
        const float x = __fmul_rn(Sc[a * dv + j], R.eg);
        Sc[a * dv + j] = x;
        m = __fadd_rn(m, __fmul_rn(x, __ldg(R.k + a)));
      }
    }
    m = __fmul_rn(__fsub_rn(__ldg(R.v + j), m), R.beta);
    float o = 0.f;
    const bool read = R.o != nullptr;
    if constexpr (DK > 0) {
#pragma unroll
      for (int a = 0; a < DK; a++) {
        s[a] = __fadd_rn(s[a], __fmul_rn(__ldg(R.k + a), m));
        if (read) o = __fadd_rn(o, __fmul_rn(s[a], __ldg(R.q + a)));
      }
    } else {
      for (int64_t a = 0; a < dk; a++) {
        const float x = __fadd_rn(Sc[a * dv + j], __fmul_rn(__ldg(R.k + a), m));
        Sc[a * dv + j] = x;
        if (read) o = __fadd_rn(o, __fmul_rn(x, __ldg(R.q + a)));
      }
    }
    if (read) R.o[j] = o;
  }
  if constexpr (DK > 0) {
#pragma unroll
    for (int a = 0; a < DK; a++) Sc[a * dv + j] = s[a];
  }
}

template <int DK>
__global__ void __launch_bounds__(32) k_dn_heads_split(float* __restrict__ S, float* __restrict__ S_work,
                                                       const __grid_constant__ DnHeads A, int T, int n_src) {
  pdl_wait();
  constexpr int H = DK / 2;
  const int64_t h = blockIdx.y, dv = A.dv;
  const int lane = threadIdx.x, half = lane >> 4, lo = lane & 15;
  const int64_t j = (int64_t)blockIdx.x * 16 + lo;
  const bool valid = j < dv;
  const int a0 = half * H;
  float* S0 = S + h * DK * dv;
  float* Sw = S_work ? S_work + h * DK * dv : nullptr;
  float s[H];
#pragma unroll
  for (int i = 0; i < H; i++) s[i] = valid ? S0[(a0 + i) * dv + j] : 0.f;
  float* Sc = S0;
  for (int t = 0; t < T; t++) {
    if (t == n_src) {
      if (valid)
#pragma unroll
        for (int i = 0; i < H; i++) S0[(a0 + i) * dv + j] = s[i];
      Sc = Sw;
    }
    const HeadRow R = head_row(A, h, t);
    const float* k = R.k + a0;
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fmul_rn(s[i], R.eg);
      m = __fadd_rn(m, __fmul_rn(s[i], __ldg(k + i)));
    }
    const float m_lo = __shfl_sync(0xffffffffu, m, lo);
    if (half == 1) {
      m = m_lo;
#pragma unroll
      for (int i = 0; i < H; i++) m = __fadd_rn(m, __fmul_rn(s[i], __ldg(k + i)));
    }
    m = __shfl_sync(0xffffffffu, m, lo + 16);
    m = __fmul_rn(__fsub_rn(valid ? __ldg(R.v + j) : 0.f, m), R.beta);
    const bool read = R.o != nullptr;
    float o = 0.f;
    const float* q = read ? R.q + a0 : nullptr;
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(__ldg(k + i), m));
      if (read) o = __fadd_rn(o, __fmul_rn(s[i], __ldg(q + i)));
    }
    if (read) {
      const float o_lo = __shfl_sync(0xffffffffu, o, lo);
      if (half == 1) {
        o = o_lo;
#pragma unroll
        for (int i = 0; i < H; i++) o = __fadd_rn(o, __fmul_rn(s[i], __ldg(q + i)));
        if (valid) R.o[j] = o;
      }
    }
  }
  if (valid)
#pragma unroll
    for (int i = 0; i < H; i++) Sc[(a0 + i) * dv + j] = s[i];
}

// k_dn_heads_split's values bit for bit (every product and sum of a value in the same order) with a column's two
// halves of S on two warps of a block, pipelined (dk = 128; windows and prompt pieces of kDuoMinT rows or more). Row
// t's m and o are sums over a = 0..127 in order, so each is a chain of 128 dependent additions, and row t + 1's m
// needs the whole of row t's update: in k_dn_heads_split the two halves of a warp take their chains in turn (256
// additions a row on the critical path, then the next row's loads). Here warp 0 holds a = 0..63 of 32 columns and
// warp 1 a = 64..127 of the same columns; a row's sums run warp 0's 64 then warp 1's 64, handed over through shared
// memory under named barriers (bar.arrive by the producer, bar.sync by the consumer). Per row t:
//   warp 1: [M1] o_{t-1} and m_t from warp 0's partial sums, interleaved (o += s q; s *= eg_t; m += s k) -> m_t
//           [M2]; then, while warp 0 works, the update by m_t
//   warp 0: [M2] the update by m_t, o_t's and m_{t+1}'s first halves, interleaved [M1]
// so a row's critical path is about two interleaved 64-addition chains a warp. Warp 0 copies the rows' k, q, eg,
// beta and v[j] into a ring of kDuoRing rows in shared memory three rows ahead with cp.async (no register waits on
// them). n_src as k_dn_heads_split: each warp writes its half of the column to S before row n_src's decay and runs
// the rest on S_work. One row stays on k_dn_heads_split (no handovers). H100, a 512-row piece of the 80B (ncu,
// session 31): 434 us against k_dn_heads_split's 1.12 ms; earlier forms of this kernel: block-wide barriers, the
// loops' cases as branches inside them (slower than k_dn_heads_split), then 616 us; the o sums moved off the path
// as products held in registers, 515-586 us (ncu: the products' 64 registers left none to load k ahead, so the m
// chain waited on each shared-memory load).
constexpr int kDuoMinT = 2;
constexpr int kDuoRing = 4;  // rows t - 1 .. t + 2; row t + 3 is copied into row t - 1's slot
bool g_dn_duo = true;  // prefer_dn_duo (off: k_dn_heads_split at every T, for the A/B)
constexpr int kDuoH = 64;  // a column's values a warp holds (dk = 128)
constexpr int kBarM1 = 1, kBarM2 = 2;  // named barriers of the two warps (0 is __syncthreads')

__device__ __forceinline__ void bar_sync2(int id) { asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_arrive2(int id) { asm volatile("bar.arrive %0, 64;" ::"r"(id) : "memory"); }
// dv as a value the compiler cannot carry through the loops: the column's 64 store addresses are computed where a
// store needs them, not held in 128 registers through the whole kernel
__device__ __forceinline__ int64_t opaque(int64_t x) {
  asm volatile("mov.b64 %0, %0;" : "+l"(x));
  return x;
}

// The per-row loops of k_dn_heads_duo, each case an instance without a branch inside (the compiler interleaves the
// two chains and loads the rows' values from shared memory 4 at a time ahead of their use).
// After m_t: s += k m (the update by row t; warp 1's, alone); warp 0's also O: o += s q (row t's first half), M:
// [SRC: the half column to S] s *= eg1, m1 += s k1 (row t + 1's first half).
template <bool O, bool M, bool SRC>
__device__ __forceinline__ void duo_first(float (&s)[kDuoH], const float* k, const float* q, const float* k1,
                                          float m, float eg1, float* col, int64_t dv, bool valid, float& o,
                                          float& m1) {
#pragma unroll
  for (int i = 0; i < kDuoH; i += 4) {
    const float4 kk = *reinterpret_cast<const float4*>(k + i);
    const float4 qq = O ? *reinterpret_cast<const float4*>(q + i) : float4{};
    const float4 k1k = M ? *reinterpret_cast<const float4*>(k1 + i) : float4{};
    const float kv[4] = {kk.x, kk.y, kk.z, kk.w}, qv[4] = {qq.x, qq.y, qq.z, qq.w};
    const float k1v[4] = {k1k.x, k1k.y, k1k.z, k1k.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
      float& x = s[i + u];
      x = __fadd_rn(x, __fmul_rn(kv[u], m));
      if constexpr (O) o = __fadd_rn(o, __fmul_rn(x, qv[u]));
      if constexpr (M) {
        if constexpr (SRC) {
          if (valid) col[(i + u) * dv] = x;
        }
        x = __fmul_rn(x, eg1);
        m1 = __fadd_rn(m1, __fmul_rn(x, k1v[u]));
      }
    }
  }
}
// Warp 1 (and warp 0 for row 0): O: o += s q (row t - 1's second half, from warp 0's partial sum); M: s *= eg,
// m += s k (row t's half, from the sum so far).
template <bool O, bool M>
__device__ __forceinline__ void duo_second(float (&s)[kDuoH], const float* q, const float* k, float eg, float& o,
                                           float& m) {
#pragma unroll
  for (int i = 0; i < kDuoH; i += 4) {
    const float4 kk = M ? *reinterpret_cast<const float4*>(k + i) : float4{};
    const float4 qq = O ? *reinterpret_cast<const float4*>(q + i) : float4{};
    const float kv[4] = {kk.x, kk.y, kk.z, kk.w}, qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
      float& x = s[i + u];
      if constexpr (O) o = __fadd_rn(o, __fmul_rn(x, qv[u]));
      if constexpr (M) {
        x = __fmul_rn(x, eg);
        m = __fadd_rn(m, __fmul_rn(x, kv[u]));
      }
    }
  }
}

template <int DK>
__global__ void __launch_bounds__(64) k_dn_heads_duo(float* __restrict__ S, float* __restrict__ S_work,
                                                     const __grid_constant__ DnHeads A, int T, int n_src) {
  pdl_wait();
  static_assert(DK == 128, "warp 0 copies a row's k and q as 4 floats a lane each");
  constexpr int H = kDuoH;
  __shared__ __align__(16) float kq[kDuoRing][2][DK];  // [row % kDuoRing][k, q][a]
  __shared__ float gb[kDuoRing][2];                    // eg, beta
  __shared__ float vr[kDuoRing][32];                   // v[j] of the block's columns
  __shared__ float part_m[32], full_m[32], part_o[32];
  const int64_t h = blockIdx.y, dv = A.dv, g = h / (A.nv / A.nk);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j = (int64_t)blockIdx.x * 32 + lane;
  const bool valid = j < dv, read = A.o != nullptr;
  const int a0 = w * H;
  auto fetch = [&](int r) {  // warp 0: row r into its ring slot, one copy group
    const int slot = r % kDuoRing;
    const float* k = A.k + (int64_t)r * A.ldk + g * DK;
#pragma unroll
    for (int i = 0; i < 4; i++) cp_async4(&kq[slot][0][lane + 32 * i], k + lane + 32 * i);
    if (read) {
      const float* q = A.q + (int64_t)r * A.ldq + g * DK;
#pragma unroll
      for (int i = 0; i < 4; i++) cp_async4(&kq[slot][1][lane + 32 * i], q + lane + 32 * i);
    }
    if (valid) cp_async4(&vr[slot][lane], A.v + (int64_t)r * A.ldv + h * dv + j);
    if (lane < 2) cp_async4(&gb[slot][lane], (lane == 0 ? A.eg : A.beta) + (int64_t)r * A.nv + h);
    cp_async_commit();
  };
  float* S0 = S + h * DK * dv;
  float* Sw = S_work ? S_work + h * DK * dv : nullptr;
  float s[H];
#pragma unroll
  for (int i = 0; i < H; i++) s[i] = valid ? S0[(a0 + i) * dv + j] : 0.f;
  float* Sc = S0;
  // before row r's decay: at n_src the half column as it stands goes to S, the rest runs on S_work
  auto at_row = [&](int r) {
    if (r == n_src) {
      const int64_t d = opaque(dv);
      if (valid)
#pragma unroll
        for (int i = 0; i < H; i++) S0[(a0 + i) * d + j] = s[i];
      Sc = Sw;
    }
  };
  if (w == 0) {  // rows 0, 1 and 2 in flight, then rows 0 and 1 complete
    fetch(0);
    if (T > 1) fetch(1);
    if (T > 2) fetch(2);
    if (T > 2) cp_async_wait<1>();
    else cp_async_wait<0>();
  }
  __syncthreads();  // rows 0 and 1 in shared memory (invalid lanes' v: never read)
  if (w == 0) {
    at_row(0);
    float o = 0.f, m = 0.f;
    duo_second<false, true>(s, nullptr, kq[0][0] + a0, gb[0][0], o, m);  // m_0's first half
    part_m[lane] = m;
    bar_arrive2(kBarM1);
    for (int t = 0; t < T; t++) {
      const int cur = t % kDuoRing, nxt = (t + 1) % kDuoRing;
      bar_sync2(kBarM2);
      const float m = full_m[lane];
      const float *k = kq[cur][0] + a0, *q = kq[cur][1] + a0, *k1 = kq[nxt][0] + a0;
      float o = 0.f, m1 = 0.f;
      if (t + 1 == T) {
        if (read) duo_first<true, false, false>(s, k, q, k1, m, 0.f, nullptr, 0, valid, o, m1);
        else duo_first<false, false, false>(s, k, q, k1, m, 0.f, nullptr, 0, valid, o, m1);
      } else {
        const float eg1 = gb[nxt][0];
        if (t + 1 == n_src) {
          float* col = S0 + a0 * dv + j;
          const int64_t d = opaque(dv);
          Sc = Sw;
          if (read) duo_first<true, true, true>(s, k, q, k1, m, eg1, col, d, valid, o, m1);
          else duo_first<false, true, true>(s, k, q, k1, m, eg1, col, d, valid, o, m1);
        } else if (read) {
          duo_first<true, true, false>(s, k, q, k1, m, eg1, nullptr, 0, valid, o, m1);
        } else {
          duo_first<false, true, false>(s, k, q, k1, m, eg1, nullptr, 0, valid, o, m1);
        }
      }
      part_o[lane] = o;
      part_m[lane] = m1;
      // row t + 2 (copied since row t - 1) complete before warp 1 may read it (at M1 for row t + 2, after the arrival
      // below for row t + 1) and before this warp reads it (after M2 for row t + 1)
      cp_async_wait<0>();
      if (t + 3 < T) fetch(t + 3);  // into row t - 1's slot: warp 1 read it last before its arrival at M2 for row t
      bar_arrive2(kBarM1);  // m_{t+1}'s first half, or (t = T - 1) o_{T-1}'s
    }
  } else {
    for (int t = 0; t <= T; t++) {
      const int cur = t % kDuoRing, prev = (t + kDuoRing - 1) % kDuoRing;
      bar_sync2(kBarM1);
      float o = part_o[lane], m = part_m[lane];
      const float* q = kq[prev][1] + a0;
      const bool o_prev = read && t > 0;
      if (t == T) {  // o_{T-1}'s second half
        if (o_prev) {
          duo_second<true, false>(s, q, nullptr, 0.f, o, m);
          if (valid) A.o[(int64_t)(t - 1) * A.ldo + h * dv + j] = o;
        }
        break;
      }
      if (o_prev && t != n_src) {  // o_{t-1}'s second half and m_t's, interleaved
        duo_second<true, true>(s, q, kq[cur][0] + a0, gb[cur][0], o, m);
      } else {  // (at n_src the half column between them)
        if (o_prev) duo_second<true, false>(s, q, nullptr, 0.f, o, m);
        at_row(t);
        duo_second<false, true>(s, nullptr, kq[cur][0] + a0, gb[cur][0], o, m);
      }
      m = __fmul_rn(__fsub_rn(vr[cur][lane], m), gb[cur][1]);
      full_m[lane] = m;
      bar_arrive2(kBarM2);
      if (o_prev && valid) A.o[(int64_t)(t - 1) * A.ldo + h * dv + j] = o;
      float unused = 0.f;  // the update by m_t alone: no o, no next row
      duo_first<false, false, false>(s, kq[cur][0] + a0, nullptr, nullptr, m, 0.f, nullptr, 0, valid, unused, unused);
    }
  }
  const int64_t d = opaque(dv);
  if (valid)
#pragma unroll
    for (int i = 0; i < H; i++) Sc[(a0 + i) * d + j] = s[i];
}

}  // namespace

void prefer_dn_duo(bool on) { g_dn_duo = on; }

void dn_heads(float* S, float* S_work, const DnHeads& a, int T, int n_src, void* stream) {
  STRATA_CHECK(T >= 1 && n_src >= 0 && (n_src >= T || S_work), "dn_heads: T = ", T, ", n_src = ", n_src);
  STRATA_CHECK(a.dk >= 1 && a.dv >= 1 && a.nk >= 1 && a.nv % a.nk == 0, "dn_heads: dk = ", a.dk, ", dv = ", a.dv,
               ", nk = ", a.nk, ", nv = ", a.nv);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const unsigned nv = (unsigned)a.nv;
  if (a.dk == 128 && T >= kDuoMinT && g_dn_duo)
    launch(k_dn_heads_duo<128>, dim3((unsigned)((a.dv + 31) / 32), nv), 64, 0, st, S, S_work, a, T, n_src);
  else if (a.dk == 128)
    launch(k_dn_heads_split<128>, dim3((unsigned)((a.dv + 15) / 16), nv), 32, 0, st, S, S_work, a, T, n_src);
  else if (a.dk == 64) launch(k_dn_heads<64>, dim3((unsigned)((a.dv + 31) / 32), nv), 32, 0, st, S, S_work, a, T,
                              n_src);
  else launch(k_dn_heads<0>, dim3((unsigned)((a.dv + 31) / 32), nv), 32, 0, st, S, S_work, a, T, n_src);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the dn_heads kernel: ", cudaGetErrorString(e));
}

}  // namespace strata::cuda
