// DeltaNet rows on the card (ops_cuda.h dn_rows): one thread per column j of S. Column j of S only ever meets
// column j of v, m and o (deltanet_state.h), so each thread runs all T rows over its own column with exactly the
// CPU's per-element operations in the CPU's order (dn_decay_delta, then dn_update / dn_update_read; increasing a,
// no contraction), and the result equals dn_rows_ref (and every CPU path) bit for bit. For dk = 64 the column
// stays in one thread's registers through the window (read once, written once), for dk = 128 in two threads'
// (k_dn_rows_split); other dk run on memory.
#include <cuda_runtime.h>

#include <stdexcept>

#include "backend/backend.h"
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
// needs the whole of row t's update; in k_dn_heads_split the two halves of a warp take their chains in turn (m: 64
// then 64, o: 64 then 64: 256 additions a row on the critical path) and row t + 1's loads start as row t ends. Here
// warp 0 holds a = 0..63 of 32 columns and warp 1 a = 64..127 of the same columns; a row's m runs warp 0's 64 then
// warp 1's 64, and each warp interleaves a row's o chain with the next row's m chain (independent: o needs the
// update by m_t, the next m that and the next row's eg). Per row, between two block barriers:
//   warp 1: o_{t-1} from warp 0's partial sum, interleaved with m_t from warp 0's partial sum -> m_t
//   warp 0: the update by m_t, o_t's partial sum interleaved with m_{t+1}'s; warp 1: the update by m_t
// so 128 additions a row on the critical path. Rows' k, q, eg, beta and v are loaded two rows ahead (registers, then
// a ring of kDuoRing rows in shared memory). n_src as k_dn_heads_split: each warp writes its half of the column to S
// before row n_src's decay and runs the rest on S_work. Measured on an H100 against k_dn_heads_split (session 31,
// docs/BENCHMARKS.md): prompt pieces of 512 rows -0.5..0.6 us a row (the default model's 512-token prefill +19 %, the
// 80B's +7 %), the default model's C(16) / C(1) 2.65 -> 2.47; one row stays on k_dn_heads_split (no barriers).
// A first version with the three cases of the per-row loops as branches inside them was slower than
// k_dn_heads_split: the loops below are instances without a branch.
constexpr int kDuoMinT = 2;
constexpr int kDuoRing = 4;  // rows t - 1 .. t + 2 (row t + 2's slot is row t - 2's, read by no warp after row t - 1)
bool g_dn_duo = true;  // prefer_dn_duo (off: k_dn_heads_split at every T, for the A/B)
constexpr int kDuoH = 64;  // a column's values a warp holds (dk = 128)

// The loops of k_dn_heads_duo, without a branch inside (each case its own instance, so that the compiler can
// interleave the two chains and load the rows' values from shared memory 4 at a time ahead of their use).
// Warp 0 after m_t: s += k m (update by row t); O: o += s q (row t's first half); M: [SRC: the half column to S]
// s *= eg1, m1 += s k1 (row t + 1's first half).
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
// Warp 1 before m_t is known: O: o += s q (row t - 1's second half, from warp 0's partial sum); s *= eg, m += s k
// (row t's second half, from warp 0's partial sum).
template <bool O>
__device__ __forceinline__ void duo_second(float (&s)[kDuoH], const float* q, const float* k, float eg, float& o,
                                           float& m) {
#pragma unroll
  for (int i = 0; i < kDuoH; i += 4) {
    const float4 kk = *reinterpret_cast<const float4*>(k + i);
    const float4 qq = O ? *reinterpret_cast<const float4*>(q + i) : float4{};
    const float kv[4] = {kk.x, kk.y, kk.z, kk.w}, qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
      float& x = s[i + u];
      if constexpr (O) o = __fadd_rn(o, __fmul_rn(x, qv[u]));
      x = __fmul_rn(x, eg);
      m = __fadd_rn(m, __fmul_rn(x, kv[u]));
    }
  }
}

template <int DK>
__global__ void __launch_bounds__(64) k_dn_heads_duo(float* __restrict__ S, float* __restrict__ S_work,
                                                     const __grid_constant__ DnHeads A, int T, int n_src) {
  pdl_wait();
  static_assert(DK == 128, "a row's k and q are 2 floats a thread each");
  constexpr int H = kDuoH;
  __shared__ __align__(16) float kq[kDuoRing][2][DK];  // [row % kDuoRing][k, q][a]
  __shared__ float gb[kDuoRing][2];                    // eg, beta
  __shared__ float vr[kDuoRing][32];                   // v[j] of the block's columns
  __shared__ float part_m[32], full_m[32], part_o[32];
  const int64_t h = blockIdx.y, dv = A.dv, g = h / (A.nv / A.nk);
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int64_t j = (int64_t)blockIdx.x * 32 + lane;
  const bool valid = j < dv, read = A.o != nullptr;
  const int a0 = w * H;
  // row r: k[tid], k[tid + 64], q alike; warp 0's lanes 0 and 1 eg and beta, warp 1's lanes v[j]
  struct Row {
    float k[2], q[2], e;
  };
  auto fetch = [&](int r) {
    Row x;
    const float* k = A.k + (int64_t)r * A.ldk + g * DK;
    const float* q = read ? A.q + (int64_t)r * A.ldq + g * DK : nullptr;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      x.k[i] = __ldg(k + tid + 64 * i);
      x.q[i] = read ? __ldg(q + tid + 64 * i) : 0.f;
    }
    if (w == 1) x.e = valid ? __ldg(A.v + (int64_t)r * A.ldv + h * dv + j) : 0.f;
    else if (lane < 2) x.e = __ldg((lane == 0 ? A.eg : A.beta) + (int64_t)r * A.nv + h);
    else x.e = 0.f;
    return x;
  };
  auto stage = [&](int r, const Row& x) {
    const int slot = r % kDuoRing;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      kq[slot][0][tid + 64 * i] = x.k[i];
      kq[slot][1][tid + 64 * i] = x.q[i];
    }
    if (w == 1) vr[slot][lane] = x.e;
    else if (lane < 2) gb[slot][lane] = x.e;
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
      if (valid)
#pragma unroll
        for (int i = 0; i < H; i++) S0[(a0 + i) * dv + j] = s[i];
      Sc = Sw;
    }
  };
  stage(0, fetch(0));
  if (T > 1) stage(1, fetch(1));
  __syncthreads();
  if (w == 0) {  // m_0's first half
    at_row(0);
    float o = 0.f, m = 0.f;
    duo_second<false>(s, nullptr, kq[0][0] + a0, gb[0][0], o, m);
    part_m[lane] = m;
  }
  __syncthreads();
  for (int t = 0; t < T; t++) {
    const int cur = t % kDuoRing;
    const bool ahead = t + 2 < T;
    Row nx;
    if (ahead) nx = fetch(t + 2);  // in flight through rows t and t + 1's first halves
    if (w == 1) {  // o_{t-1} (its second half) and m_t (its second half), interleaved
      at_row(t);
      const float* k = kq[cur][0] + a0;
      const float* q = kq[(t + kDuoRing - 1) % kDuoRing][1] + a0;
      float o = part_o[lane], m = part_m[lane];
      if (read && t > 0) {
        duo_second<true>(s, q, k, gb[cur][0], o, m);
        if (valid) A.o[(int64_t)(t - 1) * A.ldo + h * dv + j] = o;
      } else {
        duo_second<false>(s, q, k, gb[cur][0], o, m);
      }
      full_m[lane] = __fmul_rn(__fsub_rn(vr[cur][lane], m), gb[cur][1]);
    }
    __syncthreads();  // m_t in full_m
    const float m = full_m[lane];
    const float* k = kq[cur][0] + a0;
    if (w == 0) {  // the update by m_t, o_t's first half and m_{t+1}'s, interleaved
      const int nxt = (t + 1) % kDuoRing;
      const float* q = kq[cur][1] + a0;
      const float* k1 = kq[nxt][0] + a0;
      float* col = S0 + a0 * dv + j;
      float o = 0.f, m1 = 0.f;
      if (t + 1 == T) {
        if (read) duo_first<true, false, false>(s, k, q, k1, m, 0.f, col, dv, valid, o, m1);
        else duo_first<false, false, false>(s, k, q, k1, m, 0.f, col, dv, valid, o, m1);
      } else {
        const float eg1 = gb[nxt][0];
        if (t + 1 == n_src) {
          Sc = Sw;
          if (read) duo_first<true, true, true>(s, k, q, k1, m, eg1, col, dv, valid, o, m1);
          else duo_first<false, true, true>(s, k, q, k1, m, eg1, col, dv, valid, o, m1);
        } else if (read) {
          duo_first<true, true, false>(s, k, q, k1, m, eg1, col, dv, valid, o, m1);
        } else {
          duo_first<false, true, false>(s, k, q, k1, m, eg1, col, dv, valid, o, m1);
        }
      }
      part_o[lane] = o;
      part_m[lane] = m1;
    } else {
#pragma unroll
      for (int i = 0; i < H; i += 4) {
        const float4 kk = *reinterpret_cast<const float4*>(k + i);
        s[i] = __fadd_rn(s[i], __fmul_rn(kk.x, m));
        s[i + 1] = __fadd_rn(s[i + 1], __fmul_rn(kk.y, m));
        s[i + 2] = __fadd_rn(s[i + 2], __fmul_rn(kk.z, m));
        s[i + 3] = __fadd_rn(s[i + 3], __fmul_rn(kk.w, m));
      }
    }
    if (ahead) stage(t + 2, nx);
    __syncthreads();  // o_t's and m_{t+1}'s first halves in part_o, part_m; row t + 2 staged
  }
  if (w == 1 && read) {  // o_{T-1}'s second half
    const float* q = kq[(T - 1) % kDuoRing][1] + a0;
    float o = part_o[lane];
#pragma unroll
    for (int i = 0; i < H; i++) o = __fadd_rn(o, __fmul_rn(s[i], q[i]));
    if (valid) A.o[(int64_t)(T - 1) * A.ldo + h * dv + j] = o;
  }
  if (valid)
#pragma unroll
    for (int i = 0; i < H; i++) Sc[(a0 + i) * dv + j] = s[i];
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
