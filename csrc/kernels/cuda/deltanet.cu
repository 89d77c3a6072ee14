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

// k_dn_heads_split's values bit for bit (every product and sum of a value in the same order), with the rows'
// loads off their critical path (dk = 128; windows and prompt pieces of kStageMinT rows or more): k_dn_heads_split
// issues row t's eg, beta, v and k loads as row t starts (a memory round trip each row, then 64 k values a lane
// held in registers: 255 of them and 288 bytes of spills, ptxas for sm_90a). Here row t + 1's k and q are loaded
// (coalesced, 4 floats a lane each) with its eg, beta and v[j] as row t starts, into registers; at row t's end the
// warp writes k and q into the other half of a double buffer in shared memory, where row t + 1 reads them.
constexpr int kStageMinT = 2;
bool g_dn_stage = false;  // prefer_dn_stage: off until measured on a card (docs/BENCHMARKS.md)
template <int DK>
__global__ void __launch_bounds__(32) k_dn_heads_stage(float* __restrict__ S, float* __restrict__ S_work,
                                                       const __grid_constant__ DnHeads A, int T, int n_src) {
  pdl_wait();
  static_assert(DK == 128, "a row's k and q are 4 floats a lane");
  constexpr int H = DK / 2;
  __shared__ float kq[2][2][DK];  // [row & 1][k, q][a]
  const int64_t h = blockIdx.y, dv = A.dv, g = h / (A.nv / A.nk);
  const int lane = threadIdx.x, half = lane >> 4, lo = lane & 15;
  const int64_t j = (int64_t)blockIdx.x * 16 + lo;
  const bool valid = j < dv, read = A.o != nullptr;
  const int a0 = half * H;
  struct Row {
    float k[4], q[4];  // values lane + 32 i
    float eg, beta, v;
  };
  auto fetch = [&](int r) {
    Row w;
    const float* k = A.k + (int64_t)r * A.ldk + g * DK;
    const float* q = read ? A.q + (int64_t)r * A.ldq + g * DK : nullptr;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      w.k[i] = __ldg(k + lane + 32 * i);
      w.q[i] = read ? __ldg(q + lane + 32 * i) : 0.f;
    }
    w.eg = __ldg(A.eg + (int64_t)r * A.nv + h);
    w.beta = __ldg(A.beta + (int64_t)r * A.nv + h);
    w.v = valid ? __ldg(A.v + (int64_t)r * A.ldv + h * dv + j) : 0.f;
    return w;
  };
  auto stage = [&](int r, const Row& w) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      kq[r & 1][0][lane + 32 * i] = w.k[i];
      kq[r & 1][1][lane + 32 * i] = w.q[i];
    }
    __syncwarp();
  };
  float* S0 = S + h * DK * dv;
  float* Sw = S_work ? S_work + h * DK * dv : nullptr;
  float s[H];
#pragma unroll
  for (int i = 0; i < H; i++) s[i] = valid ? S0[(a0 + i) * dv + j] : 0.f;
  float* Sc = S0;
  Row cur = fetch(0);
  stage(0, cur);
  for (int t = 0; t < T; t++) {
    const bool more = t + 1 < T;
    Row nxt;
    if (more) nxt = fetch(t + 1);  // in flight through row t's sums
    if (t == n_src) {
      if (valid)
#pragma unroll
        for (int i = 0; i < H; i++) S0[(a0 + i) * dv + j] = s[i];
      Sc = Sw;
    }
    // (read through volatile: each use a shared-memory load, so no row of k is held in 64 registers)
    const volatile float* k = &kq[t & 1][0][a0];
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fmul_rn(s[i], cur.eg);
      m = __fadd_rn(m, __fmul_rn(s[i], k[i]));
    }
    const float m_lo = __shfl_sync(0xffffffffu, m, lo);
    if (half == 1) {
      m = m_lo;
#pragma unroll
      for (int i = 0; i < H; i++) m = __fadd_rn(m, __fmul_rn(s[i], k[i]));
    }
    m = __shfl_sync(0xffffffffu, m, lo + 16);
    m = __fmul_rn(__fsub_rn(cur.v, m), cur.beta);
    float o = 0.f;
    const volatile float* q = &kq[t & 1][1][a0];
#pragma unroll
    for (int i = 0; i < H; i++) {
      s[i] = __fadd_rn(s[i], __fmul_rn(k[i], m));
      if (read) o = __fadd_rn(o, __fmul_rn(s[i], q[i]));
    }
    if (read) {
      const float o_lo = __shfl_sync(0xffffffffu, o, lo);
      if (half == 1) {
        o = o_lo;
#pragma unroll
        for (int i = 0; i < H; i++) o = __fadd_rn(o, __fmul_rn(s[i], q[i]));
        if (valid) A.o[(int64_t)t * A.ldo + h * dv + j] = o;
      }
    }
    if (more) {  // every lane is past row t - 1, whose half of the buffer this overwrites (the sync of stage)
      stage(t + 1, nxt);
      cur = nxt;
    }
  }
  if (valid)
#pragma unroll
    for (int i = 0; i < H; i++) Sc[(a0 + i) * dv + j] = s[i];
}

}  // namespace

void prefer_dn_stage(bool on) { g_dn_stage = on; }

void dn_heads(float* S, float* S_work, const DnHeads& a, int T, int n_src, void* stream) {
  STRATA_CHECK(T >= 1 && n_src >= 0 && (n_src >= T || S_work), "dn_heads: T = ", T, ", n_src = ", n_src);
  STRATA_CHECK(a.dk >= 1 && a.dv >= 1 && a.nk >= 1 && a.nv % a.nk == 0, "dn_heads: dk = ", a.dk, ", dv = ", a.dv,
               ", nk = ", a.nk, ", nv = ", a.nv);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const unsigned nv = (unsigned)a.nv;
  if (a.dk == 128 && T >= kStageMinT && g_dn_stage)
    launch(k_dn_heads_stage<128>, dim3((unsigned)((a.dv + 15) / 16), nv), 32, 0, st, S, S_work, a, T, n_src);
  else if (a.dk == 128)
    launch(k_dn_heads_split<128>, dim3((unsigned)((a.dv + 15) / 16), nv), 32, 0, st, S, S_work, a, T, n_src);
  else if (a.dk == 64) launch(k_dn_heads<64>, dim3((unsigned)((a.dv + 31) / 32), nv), 32, 0, st, S, S_work, a, T,
                              n_src);
  else launch(k_dn_heads<0>, dim3((unsigned)((a.dv + 31) / 32), nv), 32, 0, st, S, S_work, a, T, n_src);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: launch of the dn_heads kernel: ", cudaGetErrorString(e));
}

}  // namespace strata::cuda
