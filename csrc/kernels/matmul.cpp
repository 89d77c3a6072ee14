#include "kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "util/common.h"
#include "util/threads.h"

namespace strata {

namespace {
// Output rows per chunk boundary: whole register groups of the kernels and whole cache lines of y.
constexpr int64_t kRowAlign = 16;
Isa detect() {
  __builtin_cpu_init();
  // The AVX-512 files are compiled with F, BW, VL, DQ and VNNI (the compiler may emit any of them, VNNI
  // included, wherever it vectorises): a CPU without all five (Skylake-SP) runs the AVX2 path.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2"))
    return Isa::AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("bmi2"))
    return Isa::AVX2;
  return Isa::Scalar;
}
const Isa g_detected = detect();
const bool g_vnni_detected = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") != 0;
}();
const bool g_vbmi_detected = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vbmi") != 0 && __builtin_cpu_supports("avx512vnni") != 0;
}();
Isa g_best = g_detected;
bool g_vnni = g_vnni_detected, g_vbmi = g_vbmi_detected;
bool g_vbmi_on = true, g_vnni_on = true;
Isa g_active = g_best;
}  // namespace

void limit_isa(Isa cap) {
  g_best = (int)cap < (int)g_detected ? cap : g_detected;
  g_vnni = g_vnni_detected && g_best == Isa::AVX512;
  g_vbmi = g_vbmi_detected && g_best == Isa::AVX512;
  if ((int)g_active > (int)g_best) g_active = g_best;
}
Isa best_isa() { return g_best; }
Isa active_isa() { return g_active; }
const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
  }
  return "?";
}
void force_isa(Isa isa) {
  if ((int)isa > (int)g_best)
    fail<std::invalid_argument>("this CPU does not support the ", isa_name(isa), " kernels (best: ", isa_name(g_best), ")");
  g_active = isa;
}

bool cpu_has_avx512vnni() { return g_vnni && g_vnni_on; }
bool cpu_has_avx512vbmi() { return g_vbmi; }
void allow_vbmi(bool on) { g_vbmi_on = on; }
void allow_vnni(bool on) { g_vnni_on = on; }
bool g_gathers = [] {  // kq_common.h: vector gathers where they are fast (Intel cores), scalar loads elsewhere
  __builtin_cpu_init();
  return __builtin_cpu_is("intel") != 0;
}();
void prefer_gathers(bool on) { g_gathers = on; }
bool gathers_preferred() { return g_gathers; }
bool vbmi_kernels_on() { return g_vbmi && g_vbmi_on && g_vnni_on; }

RowsFn rows_fn(uint32_t type, Isa isa) {
  switch (isa) {
    case Isa::AVX512:
      if (vbmi_kernels_on())
        if (auto f = rows_fn_kq_avx512vbmi(type)) return f;
      if (auto f = rows_fn_kq8_avx512(type)) return f;
      if (auto f = rows_fn_kq_avx512(type)) return f;
      if (auto f = rows_fn_avx512(type)) return f;
      [[fallthrough]];
    case Isa::AVX2:
      if (isa == Isa::AVX2)
        if (auto f = rows_fn_kq8_avx2(type)) return f;
      if (auto f = rows_fn_kq_avx2(type)) return f;
      if (auto f = rows_fn_avx2(type)) return f;
      [[fallthrough]];
    case Isa::Scalar:
      if (auto f = rows_fn_kq_ref(type)) return f;
      return rows_fn_ref(type);
  }
  return nullptr;
}

RowsManyFn rows_many_fn(uint32_t type, Isa isa) {
  if (isa == Isa::AVX2) {
    if (RowsManyFn g = rows_many_fn_kq8_avx2(type)) return g;
    return rows_many_fn_kq_avx2(type);
  }
  if (isa != Isa::AVX512) return nullptr;
  if (RowsManyFn g = rows_many_fn_kq8_avx512(type)) return g;
  if (vbmi_kernels_on() && rows_fn_kq_avx512vbmi(type)) return rows_many_fn_kq_avx512vbmi(type);  // as rows_fn
  return rows_many_fn_kq_avx512(type);
}

// The AVX-512 byte kernels read the rows interleaved (QAct::il): Q4_K's (rows_q4k8, its panels); IQ2_XXS's panels
// (as q + 128) and its VBMI row kernel (rows_iq2xxs_vbmi). Each checks that it got the layout it reads.
enum class Interleave { None, Plain, Offset };
static Interleave interleave_for(uint32_t type, bool many) {
  if (g_active != Isa::AVX512) return Interleave::None;
  if (type == GGML_Q4_K) return Interleave::Plain;
  if (type == GGML_IQ2_XXS) return many ? Interleave::Offset : vbmi_kernels_on() ? Interleave::Plain : Interleave::None;
  return Interleave::None;
}

Act prepare_act(uint32_t type, const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, bool many) {
  STRATA_CHECK(T >= 1 && T <= kMaxRowsPerPass, "prepare_act: T = ", T, " outside 1..", kMaxRowsPerPass);
  Act a;
  a.x = x;
  a.ldx = ldx;
  a.T = T;
  if (int_act_type(type)) {
    STRATA_CHECK(cols % QK_K == 0, "matmul: ", type_name(type), " rows need cols % 256 == 0, got ", cols);
    // All three quantizers produce the same bytes (tested); pick the fast one.
    QuantizeFn q = g_active == Isa::AVX512 ? quantize_act_avx512
                   : g_active == Isa::AVX2 ? quantize_act_avx2
                                           : quantize_act_ref;
    q(x, ldx, T, cols, buf, a.q);
    // the vpmaddubsw kernels (cpu/kquants8_avx2.cpp); the pair sums for the unsigned Q6_K decode windows
    if (g_active == Isa::AVX2) buf.fill_q8(a.q, type == GGML_Q6_K);
    const Interleave il = interleave_for(type, many);
    if (il != Interleave::None) interleave_act_avx512(buf, a.q, il == Interleave::Offset);
  } else if (act32_type(type)) {
    STRATA_CHECK(cols % 32 == 0, "matmul: ", type_name(type), " rows need cols % 32 == 0, got ", cols);
    (g_active == Isa::Scalar ? quantize_act32_ref : quantize_act32_avx2)(x, ldx, T, cols, buf.b32, a.q32);
  }
  return a;
}

static RowsFn get_fn(const MatView& W) {
  RowsFn f = rows_fn(W.type, g_active);
  if (!f) fail<std::invalid_argument>("no matmul kernel for weight type ", type_name(W.type));
  return f;
}

void matmul_range(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, int64_t r0,
                  int64_t r1) {
  STRATA_CHECK(T >= 1 && T <= kMaxRowsPerPass, "matmul_range: T = ", T, " outside 1..", kMaxRowsPerPass);
  RowsFn f = get_fn(W);
  thread_local QActBuf buf;
  f(W, prepare_act(W.type, x, ldx, T, W.cols, buf), y, ldy, r0, r1);
}

void matmul_range(const MatView& W, const Act& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  STRATA_CHECK(a.T >= 1 && a.T <= kMaxRowsPerPass, "matmul_range: T = ", a.T, " outside 1..", kMaxRowsPerPass);
  STRATA_CHECK(!int_act_type(W.type) || a.q.q, "matmul_range: rows not prepared for ", type_name(W.type));
  STRATA_CHECK(!act32_type(W.type) || a.q32.q, "matmul_range: rows not prepared for ", type_name(W.type));
  get_fn(W)(W, a, y, ldy, r0, r1);
}

void ActRows::prepare(uint32_t type, const float* x, int64_t ldx, int T_, int64_t cols) {
  STRATA_CHECK(T_ >= 1, "matmul: T = ", T_);
  T = T_;
  const int np = (T + kMaxRowsPerPass - 1) / kMaxRowsPerPass;
  if ((int)bufs.size() < np) bufs.resize(np);  // before any Act points into them
  pass.resize(np);
  for (int p = 0; p < np; p++) {
    const int t0 = p * kMaxRowsPerPass, tn = T - t0 < kMaxRowsPerPass ? T - t0 : kMaxRowsPerPass;
    pass[p] = prepare_act(type, x + t0 * ldx, ldx, tn, cols, bufs[p], np > 1);
  }
}

void matmul_rows(const MatView& W, const ActRows& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  RowsFn f = get_fn(W);
  const int np = (int)a.pass.size();
  if (np == 1) return f(W, a.pass[0], y, ldy, r0, r1);
  if (RowsManyFn g = rows_many_fn(W.type, g_active)) return g(W, a.pass.data(), np, y, ldy, r0, r1);
  const int64_t tile = std::max<int64_t>(16, ((int64_t)(32768 / std::max<size_t>(W.row_bytes, 1)) + 15) / 16 * 16);
  for (int64_t rb = r0; rb < r1; rb += tile) {
    const int64_t re = std::min(r1, rb + tile);
    for (int p = 0; p < np; p++) f(W, a.pass[p], y + (int64_t)p * kMaxRowsPerPass * ldy, ldy, rb, re);
  }
}

void matmul(ThreadPool& pool, const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy) {
  STRATA_CHECK(T >= 1, "matmul: T = ", T);
  get_fn(W);  // an unsupported type fails here, before any work
  thread_local ActRows act;  // prepared once, shared read-only by the workers
  act.prepare(W.type, x, ldx, T, W.cols);
  const ActRows& a = act;
  // Small products are not worth waking the pool for.
  if (W.rows * W.cols * (int64_t)T < (1 << 15)) return matmul_rows(W, a, y, ldy, 0, W.rows);
  pool.parallel_for(W.rows, [&](int64_t b, int64_t e, int) { matmul_rows(W, a, y, ldy, b, e); }, kRowAlign, T);
}

}  // namespace strata

namespace strata {

void matmul_many(ThreadPool& pool, const MatOut* outs, int n, const float* x, int64_t ldx, int T) {
  STRATA_CHECK(T >= 1 && n >= 1, "matmul_many: T = ", T, ", n = ", n);
  std::vector<int64_t> start(n + 1, 0);  // global row index of each product's first row
  thread_local std::vector<ActRows> acts;
  if ((int)acts.size() < n) acts.resize(n);
  for (int i = 0; i < n; i++) {
    STRATA_CHECK(outs[i].W->cols == outs[0].W->cols, "matmul_many: products of different input widths");
    get_fn(*outs[i].W);
    start[i + 1] = start[i] + outs[i].W->rows;
    acts[i].prepare(outs[i].W->type, x, ldx, T, outs[i].W->cols);
  }
  const std::vector<ActRows>& a = acts;
  pool.parallel_for(start[n], [&](int64_t b, int64_t e, int) {
    for (int i = 0; i < n; i++) {
      const int64_t lo = b > start[i] ? b : start[i], hi = e < start[i + 1] ? e : start[i + 1];
      if (lo < hi) matmul_rows(*outs[i].W, a[i], outs[i].y, outs[i].ldy, lo - start[i], hi - start[i]);
    }
  }, kRowAlign, T);
}

}  // namespace strata
