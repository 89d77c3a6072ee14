// Kernel entry points for tests and benches: dequantize, and the row products on a chosen ISA path.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attend.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"
#include "kernels/rowops.h"
#include "model/layers.h"
#include "state/deltanet_chunked.h"
#include "state/deltanet_state.h"
#include "util/common.h"
#include "util/threads.h"

namespace nb = nanobind;
using namespace strata;

using U8 = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using F2 = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// "" = the active path (best_isa() unless forced)
static Isa parse_isa(const std::string& s) {
  if (s.empty()) return active_isa();
  if (s == "scalar" || s == "ref") return Isa::Scalar;
  if (s == "avx2") return Isa::AVX2;
  if (s == "avx512") return Isa::AVX512;
  fail<std::invalid_argument>("unknown ISA '", s, "' (scalar, avx2, avx512)");
}

void init_kernels(nb::module_& m) {
  m.def("best_isa", [] { return std::string(isa_name(best_isa())); });
  m.def("has_avx512vbmi", [] { return cpu_has_avx512vbmi(); });
  m.def("allow_vbmi", [](bool on) { allow_vbmi(on); }, nb::arg("on"),
        "Tests: whether the AVX-512 path may use the VBMI kernels (IQ2_XXS, IQ3_XXS); results are the same either way.");
  m.def("allow_vnni", [](bool on) { allow_vnni(on); }, nb::arg("on"),
        "Tests: whether the AVX-512 kernels may use VNNI (and so VBMI); results are the same either way.");
  m.def("prefer_gathers", [](bool on) { prefer_gathers(on); }, nb::arg("on"),
        "Tests: whether the AVX2 IQ kernels look up grid rows by vector gathers (else scalar loads); the same results.");
  m.def("gathers_preferred", [] { return gathers_preferred(); });
  m.def("active_isa", [] { return std::string(isa_name(active_isa())); });
  m.def("limit_isa", [](const std::string& s) { limit_isa(parse_isa(s)); }, nb::arg("cap"),
        "Tests: behave as a CPU whose best path is min(this CPU's, cap) (best_isa, the active path, VNNI/VBMI follow).");
  m.def("force_isa", [](const std::string& s) { force_isa(parse_isa(s)); }, nb::arg("isa"),
        "Select the kernel path (tests and benches). Raises if this CPU lacks it.");
  m.def("type_info", [](const std::string& name) {
    for (uint32_t id = 0; id < 64; id++) {
      const TypeTraits* t = type_traits(id);
      if (t && name == t->name) return nb::make_tuple(t->id, t->block_size, t->type_size, t->dequant != nullptr);
    }
    fail<std::invalid_argument>("unknown ggml type '", name, "'");
  });
  m.def(
      "dequantize",
      [](U8 data, const std::string& type, int64_t n) {
        const TypeTraits* t = nullptr;
        for (uint32_t id = 0; id < 64 && !t; id++)
          if (type_traits(id) && type == type_traits(id)->name) t = type_traits(id);
        STRATA_CHECK(t && t->dequant, "dequantize: unsupported type '", type, "'");
        STRATA_CHECK(n % t->block_size == 0, "dequantize: n = ", n, " is not a multiple of ", t->block_size);
        STRATA_CHECK((int64_t)data.size() == n / t->block_size * t->type_size, "dequantize: ", data.size(),
                     " bytes for ", n, " values of ", type);
        float* out = new float[n];
        t->dequant(data.data(), out, n);
        nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, {(size_t)n}, owner);
      },
      nb::arg("data"), nb::arg("type"), nb::arg("n"));
  m.def(
      "quantize_act",
      [](F2 x, const std::string& isa) {
        // The int8 activation rows the K/IQ kernels use (tests: every ISA's quantizer gives the same bytes).
        const int T = (int)x.shape(0);
        const int64_t cols = (int64_t)x.shape(1);
        QActBuf buf;
        QAct a;
        const Isa i = parse_isa(isa);
        if ((int)i > (int)best_isa()) fail<std::invalid_argument>("this CPU does not support the ", isa, " kernels");
        (i == Isa::AVX512 ? quantize_act_avx512 : i == Isa::AVX2 ? quantize_act_avx2 : quantize_act_ref)(
            x.data(), cols, T, cols, buf, a);
        nb::list q, d, bs;
        for (int t = 0; t < T; t++) {
          nb::list qt, dt, bt;
          for (int64_t c = 0; c < cols; c++) qt.append((int)a.q[t * a.ldq + c]);
          for (int64_t b = 0; b < a.nb; b++) {
            dt.append(a.d[b * 8 + t]);
            for (int j = 0; j < 8; j++) bt.append((int)a.bsum[(b * 4 + j / 2) * 16 + 2 * t + (j & 1)]);
          }
          q.append(qt);
          d.append(dt);
          bs.append(bt);
        }
        return nb::make_tuple(q, d, bs);
      },
      nb::arg("x"), nb::arg("isa") = "scalar", "(q[T][cols], dx[T][nb], bsum[T][nb*8]) as Python lists (tests).");
  m.def(
      "quantize_act32",
      [](F2 x, const std::string& isa) {
        // The 32-block int8 rows of Q4_0 / Q5_0 / IQ4_NL / MXFP4 (act32.h; tests: both quantizers, the same bytes).
        const int T = (int)x.shape(0);
        const int64_t cols = (int64_t)x.shape(1);
        const Isa i = parse_isa(isa);
        if ((int)i > (int)best_isa()) fail<std::invalid_argument>("this CPU does not support the ", isa, " kernels");
        QAct32Buf buf;
        QAct32 a;
        (i == Isa::Scalar ? quantize_act32_ref : quantize_act32_avx2)(x.data(), cols, T, cols, buf, a);
        nb::list q, d;
        for (int t = 0; t < T; t++) {
          nb::list qt, dt;
          for (int64_t c = 0; c < cols; c++) qt.append((int)a.q[t * a.ldq + c]);
          for (int64_t b = 0; b < a.nb; b++) dt.append(a.d[b * 8 + t]);
          q.append(qt);
          d.append(dt);
        }
        return nb::make_tuple(q, d);
      },
      nb::arg("x"), nb::arg("isa") = "scalar", "(q[T][cols], dx[T][cols/32]) as Python lists (tests).");
  m.def(
      "rowop",
      [](const std::string& name, F2 x, F2 y, const std::string& isa) {
        // One rowops.h function on the chosen build (tests): x is modified in a copy and returned;
        // y is the second operand (u, z or g; conv: the transposed taps [K][cd] with x the history).
        const Isa want = parse_isa(isa);
        STRATA_CHECK((int)want <= (int)best_isa(), "rowop: this CPU lacks ", isa);
        const RowOps& ops = rowops_for((int)want);
        std::vector<float> a(x.data(), x.data() + x.size());
        const int64_t n = (int64_t)a.size();
        if (name == "vexp") {
          for (auto& v : a) v = vexp(v);
        } else if (name == "silu") {
          ops.silu_inplace(a.data(), n);
        } else if (name == "exp_shift") {
          ops.exp_shift(a.data(), y.data()[0], n);
        } else if (name == "conv") {
          const int K = (int)y.shape(0);
          const int64_t cd = y.shape(1);
          const int T = (int)x.shape(0) - (K - 1);
          STRATA_CHECK(T >= 1 && (int64_t)x.shape(1) == cd, "rowop conv: x[K-1+T][cd], y[K][cd]");
          std::vector<float> out((size_t)(T * cd));
          ops.causal_conv_silu(x.data(), y.data(), T, cd, cd, K, out.data());
          return out;
        } else {
          STRATA_CHECK((int64_t)y.size() == n, "rowop: y must have x's size");
          if (name == "silu_mul") ops.silu_mul(a.data(), y.data(), n);
          else if (name == "mul_silu") ops.mul_silu(a.data(), y.data(), n);
          else if (name == "mul_sigmoid") ops.mul_sigmoid(a.data(), y.data(), n);
          else if (name == "axpy") ops.axpy(a.data(), y.data(), 0.7f, n);  // x + 0.7 * y
          else fail<std::invalid_argument>("rowop: unknown function '", name, "'");
        }
        return a;
      },
      nb::arg("name"), nb::arg("x"), nb::arg("y"), nb::arg("isa") = "", "One rowops.h function (tests).");
  m.def(
      "qsa_select",
      [](std::vector<float> scores, int64_t kb) {
        std::vector<int32_t> out;
        qsa_select_blocks(scores.data(), (int64_t)scores.size(), kb, out);
        return out;
      },
      nb::arg("scores"), nb::arg("kb"), "QSA's block selection rule (tests): kb best, ties to the lower index.");
  m.def(
      "attend",
      [](F2 q, int nh, F2 k, F2 v, int64_t n0, float scale, const std::string& isa, std::vector<int32_t> cells,
         bool one_query) {
        // Rows t = 0..T-1 of nh heads (q[T*nh][hd], row-major by row then head) over cells 0..n0+t-1 of
        // k/v[n][hd] (tests); returns o[T*nh][hd] on the chosen path. cells (T = 1): attend to those cells
        // of k/v instead (n0 must be their count). one_query: the fast path's one-query-at-a-time twin.
        const int64_t nq = q.shape(0), hd = q.shape(1), n = k.shape(0);
        STRATA_CHECK(nh >= 1 && nq % nh == 0 && n0 >= 1 && (int64_t)k.shape(1) == hd && (int64_t)v.shape(0) == n &&
                         (int64_t)v.shape(1) == hd && n0 + nq / nh - 1 <= n,
                     "attend: shapes q[T*nh][hd], k[n][hd], v[n][hd], n0 + T - 1 <= n");
        const int T = (int)(nq / nh);
        std::vector<float> o((size_t)(nq * hd));
        AttendArgs a{q.data(), nh * hd, hd, T, nh, k.data(), v.data(), hd, n0, hd, scale, o.data(), nh * hd, hd};
        if (!cells.empty()) {
          STRATA_CHECK(T == 1 && (int64_t)cells.size() == n0, "attend: a cell list needs T = 1 and n0 = its length");
          for (int32_t c : cells) STRATA_CHECK(c >= 0 && c < n, "attend: cell ", c, " outside k/v");
          a.cells = cells.data();
        }
        std::vector<float> sc((size_t)attend_scratch(a));
        const Isa want = parse_isa(isa);
        STRATA_CHECK((int)want <= (int)best_isa(), "attend: this CPU lacks ", isa);
        attend_on((int)want, a, sc.data(), one_query);
        return o;
      },
      nb::arg("q"), nb::arg("nh"), nb::arg("k"), nb::arg("v"), nb::arg("n0"), nb::arg("scale"),
      nb::arg("isa") = "", nb::arg("cells") = std::vector<int32_t>{}, nb::arg("one_query") = false,
      "Causal attention of T rows x nh heads over shared cells, or one row over a cell list (tests).");
  m.def("attend_one_query", &attend_set_one_query, nb::arg("on"),
        "Benches only: the model's attention takes the one-query path (same bits, slower) while on.");
  m.def(
      "bench_attend",
      [](int T, int nh, int64_t n0, int64_t hd, int64_t ldkv, const std::string& isa, bool one_query, int reps) {
        // Seconds per call (best of reps, after a warm-up) of one attention job as the model runs it: T rows x
        // nh heads over n0 + T - 1 cells of a cache whose cells are ldkv floats apart (several KV heads per
        // cell), random inputs, one thread, GIL released.
        STRATA_CHECK(T >= 1 && nh >= 1 && n0 >= 1 && hd >= 1 && ldkv >= hd && reps >= 1, "bench_attend: bad sizes");
        const int64_t n = n0 + T - 1;
        std::vector<float> q((size_t)(T * nh * hd)), kv((size_t)(2 * n * ldkv)), o((size_t)(T * nh * hd));
        uint32_t r = 12345;
        auto rnd = [&] { r = r * 1664525u + 1013904223u; return (float)(int32_t)(r >> 8) / (float)(1 << 23) - 1.f; };
        for (float& x : q) x = rnd();
        for (float& x : kv) x = rnd();
        AttendArgs a{q.data(), nh * hd, hd, T, nh, kv.data(), kv.data() + n * ldkv, ldkv, n0, hd,
                     1.f / std::sqrt((float)hd), o.data(), nh * hd, hd};
        std::vector<float> sc((size_t)attend_scratch(a));
        const Isa want = parse_isa(isa);
        STRATA_CHECK((int)want <= (int)best_isa(), "bench_attend: this CPU lacks ", isa);
        double best = 1e30;
        {
          nb::gil_scoped_release rel;
          attend_on((int)want, a, sc.data(), one_query);
          for (int i = 0; i < reps; i++) {
            Timer tm;
            attend_on((int)want, a, sc.data(), one_query);
            best = std::min(best, tm.seconds());
          }
        }
        return best;
      },
      nb::arg("T"), nb::arg("nh"), nb::arg("n0"), nb::arg("hd"), nb::arg("ldkv"), nb::arg("isa") = "",
      nb::arg("one_query") = false, nb::arg("reps") = 5,
      "Seconds per attention job (benches): T rows x nh heads over n0 + T - 1 cells.");
  m.def(
      "dn_rows",
      [](F2 S, F2 k, F2 v, F2 q, F2 gates, int n_src, bool read, bool ref) {
        // One value head through T rows (tests): returns (S after rows < n_src, S_work after all rows, o[T][dv]).
        const int64_t dk = S.shape(0), dv = S.shape(1);
        const int T = (int)k.shape(0);
        STRATA_CHECK(T >= 1 && (int64_t)k.shape(1) == dk && (int64_t)q.shape(1) == dk && (int64_t)v.shape(1) == dv &&
                         (int64_t)v.shape(0) == T && (int64_t)q.shape(0) == T && (int64_t)gates.shape(0) == T &&
                         gates.shape(1) == 2,
                     "dn_rows: shapes S[dk][dv], k/q[T][dk], v[T][dv], gates[T][2] (eg, beta)");
        std::vector<float> s0(S.data(), S.data() + dk * dv), sw((size_t)(dk * dv), 0.f), o((size_t)(T * dv), 0.f);
        std::vector<DnRow> rows(T);
        for (int t = 0; t < T; t++)
          rows[t] = {k.data() + t * dk, v.data() + t * dv, q.data() + t * dk, gates.data()[2 * t], gates.data()[2 * t + 1],
                     read ? o.data() + t * dv : nullptr};
        (ref ? dn_rows_ref : dn_rows)(s0.data(), sw.data(), rows.data(), T, n_src, dk, dv);
        return std::make_tuple(s0, sw, o);
      },
      nb::arg("S"), nb::arg("k"), nb::arg("v"), nb::arg("q"), nb::arg("gates"), nb::arg("n_src"), nb::arg("read") = true,
      nb::arg("ref") = false, "The DeltaNet window recurrence of one head (dn_rows or its row-by-row twin), for tests.");
  m.def(
      "dn_chunked",
      [](F2 S, F2 k, F2 v, F2 q, F2 gates, const std::string& isa) {
        // One value head through T rows in the chunked form (tests): returns (S after the rows, o[T][dv]);
        // gates[t] = (g, beta) with g the log decay.
        const int64_t dk = S.shape(0), dv = S.shape(1);
        const int T = (int)k.shape(0);
        STRATA_CHECK(T >= 1 && (int64_t)k.shape(1) == dk && (int64_t)q.shape(1) == dk && (int64_t)v.shape(1) == dv &&
                         (int64_t)v.shape(0) == T && (int64_t)q.shape(0) == T && (int64_t)gates.shape(0) == T &&
                         gates.shape(1) == 2,
                     "dn_chunked: shapes S[dk][dv], k/q[T][dk], v[T][dv], gates[T][2] (g, beta)");
        const Isa want = parse_isa(isa);
        STRATA_CHECK((int)want <= (int)best_isa(), "dn_chunked: this CPU lacks ", isa);
        std::vector<float> s0(S.data(), S.data() + dk * dv), o((size_t)(T * dv), 0.f);
        const DnSeq seq{k.data(), dk, v.data(), dv, q.data(), dk, gates.data(), gates.data() + 1, 2, o.data(), dv};
        dn_chunked_on((int)want, s0.data(), seq, T, dk, dv);
        return std::make_tuple(s0, o);
      },
      nb::arg("S"), nb::arg("k"), nb::arg("v"), nb::arg("q"), nb::arg("gates"), nb::arg("isa") = "",
      "The chunked gated delta rule over T rows of one head (state/deltanet_chunked.h), for tests.");
  m.def(
      "matmul",
      [](U8 w, const std::string& type, int64_t rows, int64_t cols, F2 x, const std::string& isa, int threads,
         const std::string& act_type) {
        const auto find = [](const std::string& name) {
          const TypeTraits* t = nullptr;
          for (uint32_t id = 0; id < 64 && !t; id++)
            if (type_traits(id) && name == type_traits(id)->name) t = type_traits(id);
          STRATA_CHECK(t && t->dequant, "matmul: unsupported type '", name, "'");
          return t;
        };
        const TypeTraits* t = find(type);
        const TypeTraits* at = act_type.empty() ? nullptr : find(act_type);
        STRATA_CHECK(!at || act_kind(at->id) == act_kind(t->id), "matmul: act_type '", act_type,
                     "' reads its rows another way than '", type, "'");
        STRATA_CHECK((int64_t)x.shape(1) == cols, "matmul: x has ", x.shape(1), " columns, expected ", cols);
        MatView W{w.data(), t->id, rows, cols, row_bytes(t->id, cols)};
        STRATA_CHECK((int64_t)w.size() == (int64_t)W.row_bytes * rows, "matmul: weight has ", w.size(), " bytes, expected ",
                     W.row_bytes * rows);
        const int T = (int)x.shape(0);
        float* out = new float[(size_t)T * rows];
        const Isa prev = active_isa();
        force_isa(parse_isa(isa));
        try {
          if (at) {  // rows prepared for another type of the same kind (as moe.cpp shares them), one thread
            ActRows act;
            act.prepare(at->id, x.data(), cols, T, cols);
            matmul_rows(W, act, out, rows, 0, rows);
          } else {
            ThreadPool pool(threads);
            matmul(pool, W, x.data(), cols, T, out, rows);
          }
        } catch (...) {
          force_isa(prev);
          delete[] out;
          throw;
        }
        force_isa(prev);
        nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, {(size_t)T, (size_t)rows}, owner);
      },
      nb::arg("w"), nb::arg("type"), nb::arg("rows"), nb::arg("cols"), nb::arg("x"), nb::arg("isa") = "",
      nb::arg("threads") = 1, nb::arg("act_type") = "",
      "y[T, rows] = x[T, cols] @ W^T on the chosen kernel path; act_type: the rows prepared for that type (of the "
      "same activation kind), as an MoE expert's gate and up share them.");
  m.def(
      "bench_matmul",
      [](U8 w, const std::string& type, int64_t rows, int64_t cols, int64_t nmat, F2 x, const std::string& isa,
         int threads, int reps) {
        // Seconds per product, rotating over nmat matrices stored back to back in w (so caches do not
        // flatter), one pool for the whole run, GIL released.
        const TypeTraits* t = nullptr;
        for (uint32_t id = 0; id < 64 && !t; id++)
          if (type_traits(id) && type == type_traits(id)->name) t = type_traits(id);
        STRATA_CHECK(t && t->dequant, "bench_matmul: unsupported type '", type, "'");
        const size_t rb = row_bytes(t->id, cols);
        STRATA_CHECK((int64_t)w.size() >= (int64_t)(rb * rows * nmat), "bench_matmul: weight buffer too small");
        STRATA_CHECK((int64_t)x.shape(1) == cols, "bench_matmul: x has ", x.shape(1), " columns");
        const int T = (int)x.shape(0);
        std::vector<float> out((size_t)T * rows);
        const Isa prev = active_isa();
        force_isa(parse_isa(isa));
        double sec = 0;
        {
          nb::gil_scoped_release rel;
          ThreadPool pool(threads);
          auto one = [&](int64_t i) {
            MatView W{w.data() + (size_t)(i % nmat) * rb * rows, t->id, rows, cols, rb};
            matmul(pool, W, x.data(), cols, T, out.data(), rows);
          };
          for (int64_t i = 0; i < nmat; i++) one(i);  // warm-up: page in, wake threads
          Timer tm;
          for (int64_t i = 0; i < (int64_t)reps * nmat; i++) one(i);
          sec = tm.seconds() / ((double)reps * nmat);
        }
        force_isa(prev);
        return sec;
      },
      nb::arg("w"), nb::arg("type"), nb::arg("rows"), nb::arg("cols"), nb::arg("nmat"), nb::arg("x"),
      nb::arg("isa") = "", nb::arg("threads") = 1, nb::arg("reps") = 3);
}
