#include "kernels/matmul.h"

#include "util/common.h"
#include "util/threads.h"

namespace strata {

namespace {
Isa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Isa::AVX2;
  return Isa::Scalar;
}
Isa g_best = detect();
Isa g_active = g_best;
}  // namespace

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

RowsFn rows_fn(uint32_t type, Isa isa) {
  switch (isa) {
    case Isa::AVX512: if (auto f = rows_fn_avx512(type)) return f; [[fallthrough]];
    case Isa::AVX2: if (auto f = rows_fn_avx2(type)) return f; [[fallthrough]];
    case Isa::Scalar: return rows_fn_ref(type);
  }
  return nullptr;
}

static RowsFn get_fn(const MatView& W) {
  RowsFn f = rows_fn(W.type, g_active);
  if (!f) fail<std::invalid_argument>("no matmul kernel for weight type ", type_name(W.type));
  return f;
}

void matmul_range(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, int64_t r0,
                  int64_t r1) {
  STRATA_CHECK(T >= 1 && T <= kMaxRowsPerPass, "matmul_range: T = ", T, " outside 1..", kMaxRowsPerPass);
  get_fn(W)(W, x, ldx, T, y, ldy, r0, r1);
}

void matmul(ThreadPool& pool, const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy) {
  STRATA_CHECK(T >= 1, "matmul: T = ", T);
  RowsFn f = get_fn(W);
  // Small products are not worth waking the pool for.
  const bool serial = W.rows * W.cols * (int64_t)T < (1 << 15);
  for (int t0 = 0; t0 < T; t0 += kMaxRowsPerPass) {
    const int tn = T - t0 < kMaxRowsPerPass ? T - t0 : kMaxRowsPerPass;
    const float* xp = x + t0 * ldx;
    float* yp = y + t0 * ldy;
    if (serial) {
      f(W, xp, ldx, tn, yp, ldy, 0, W.rows);
    } else {
      pool.parallel_for(W.rows, [&](int64_t b, int64_t e, int) { f(W, xp, ldx, tn, yp, ldy, b, e); });
    }
  }
}

}  // namespace strata
