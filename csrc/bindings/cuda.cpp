// The backend interface and the CUDA backend for tests and benches: every operation through a chosen backend
// ("cpu" or "cuda", inputs copied into its memory, outputs poisoned with NaN / -1 first so that an unwritten
// element shows), device timing. A build without CUDA answers cuda_available() False and raises RuntimeError
// (naming the CMake option) from everything that needs the GPU.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "model/backend_forward.h"
#include "backend/cuda_bench.h"
#include "kernels/types.h"
#include "sampling/sampler.h"
#include "util/common.h"

namespace nb = nanobind;
using namespace strata;

using U8 = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using F1 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F2 = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OutF2 = nb::ndarray<nb::numpy, float, nb::ndim<2>>;
using I1 = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

namespace {

// One backend of each kind per process (the CUDA one owns a stream and the decoders' tables).
Backend& backend(const std::string& name) {
  static std::mutex mu;
  static std::unique_ptr<Backend> cpu, cuda;
  std::lock_guard<std::mutex> lock(mu);
  if (name == "cpu") {
    if (!cpu) cpu = make_cpu_backend(1);
    return *cpu;
  }
  if (name == "cuda") {
    if (!cuda) cuda = make_cuda_backend(0);
    return *cuda;
  }
  fail<std::invalid_argument>("unknown backend '", name, "' (cpu, cuda)");
}

const TypeTraits* traits_named(const std::string& type) {
  for (uint32_t id = 0; id < 64; id++)
    if (type_traits(id) && type == type_traits(id)->name) return type_traits(id);
  fail<std::invalid_argument>("unknown ggml type '", type, "'");
}

// A buffer in a backend's memory, released on scope exit.
struct Buf {
  Backend& be;
  void* p;
  Buf(Backend& b, size_t bytes) : be(b), p(b.alloc(bytes)) {}
  Buf(Backend& b, const void* host, size_t bytes) : Buf(b, bytes) { be.upload(p, host, bytes); }
  ~Buf() { be.release(p); }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

OutF2 new_out(size_t T, size_t n, float** data) {
  *data = new float[T * n];
  nb::capsule owner(*data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return OutF2(*data, {T, n}, owner);
}

MatView checked_view(const TypeTraits* t, const void* data, int64_t rows, int64_t cols, size_t have) {
  STRATA_CHECK(t->dequant, "unsupported weight type ", t->name);
  STRATA_CHECK(rows >= 1 && cols >= 1 && cols % t->block_size == 0, "weight ", rows, " x ", cols, " of ", t->name,
               ": cols must be a multiple of ", t->block_size);
  const MatView W{static_cast<const uint8_t*>(data), t->id, rows, cols, row_bytes(t->id, cols)};
  STRATA_CHECK(have >= W.row_bytes * rows, "weight has ", have, " bytes, ", rows, " x ", cols, " of ", t->name,
               " needs ", W.row_bytes * rows);
  return W;
}

template <class T>
std::vector<T> poisoned(size_t n, T v) {
  return std::vector<T>(n, v);
}
constexpr float kNaN = NAN;

// dn_rows: S[dk][dv], k/q[T][dk], v[T][dv], gates[T][2] (eg, beta); the device rows for T rows.
struct DnInputs {
  int64_t dk, dv;
  int T;
  Buf s, sw, k, v, q, o;
  std::vector<DnRow> rows;
  DnInputs(Backend& be, F2 S, F2 k_, F2 v_, F2 q_, F2 gates, bool read)
      : dk((int64_t)S.shape(0)), dv((int64_t)S.shape(1)), T((int)k_.shape(0)), s(be, S.data(), S.size() * 4),
        sw(be, poisoned(S.size(), kNaN).data(), S.size() * 4), k(be, k_.data(), k_.size() * 4),
        v(be, v_.data(), v_.size() * 4), q(be, q_.data(), q_.size() * 4),
        o(be, poisoned((size_t)T * dv, kNaN).data(), (size_t)T * dv * 4) {
    for (int t = 0; t < T; t++)
      rows.push_back({k.as<float>() + t * dk, v.as<float>() + t * dv, q.as<float>() + t * dk, gates.data()[2 * t],
                      gates.data()[2 * t + 1], read ? o.as<float>() + t * dv : nullptr});
  }
};
void check_dn(F2 S, F2 k, F2 v, F2 q, F2 gates, int n_src) {
  const int64_t dk = S.shape(0), dv = S.shape(1);
  const int64_t T = k.shape(0);
  STRATA_CHECK(T >= 1 && (int64_t)k.shape(1) == dk && (int64_t)q.shape(1) == dk && (int64_t)v.shape(1) == dv &&
                   (int64_t)v.shape(0) == T && (int64_t)q.shape(0) == T && (int64_t)gates.shape(0) == T &&
                   gates.shape(1) == 2 && n_src >= 0,
               "backend_dn_rows: shapes S[dk][dv], k/q[T][dk], v[T][dv], gates[T][2] (eg, beta), n_src >= 0");
}

// attend: q[T*nh][hd] (row then head), k/v[n][hd], rows over cells 0..n0+t-1, or one row over a cell list.
struct AttendInputs {
  Buf q, k, v, o, cells;
  AttendArgs a;
  AttendInputs(Backend& be, F2 q_, int nh, F2 k_, F2 v_, int64_t n0, float scale, const std::vector<int32_t>& c)
      : q(be, q_.data(), q_.size() * 4), k(be, k_.data(), k_.size() * 4), v(be, v_.data(), v_.size() * 4),
        o(be, poisoned(q_.size(), kNaN).data(), q_.size() * 4), cells(be, c.data(), c.size() * 4) {
    const int64_t nq = q_.shape(0), hd = q_.shape(1), n = k_.shape(0);
    STRATA_CHECK(nh >= 1 && nq % nh == 0 && n0 >= 0 && (int64_t)k_.shape(1) == hd && (int64_t)v_.shape(0) == n &&
                     (int64_t)v_.shape(1) == hd && n0 + nq / nh - 1 <= n,
                 "backend_attend: shapes q[T*nh][hd], k[n][hd], v[n][hd], n0 + T - 1 <= n");
    const int T = (int)(nq / nh);
    a = AttendArgs{q.as<float>(), nh * hd, hd, T, nh, k.as<float>(), v.as<float>(), hd, n0, hd, scale,
                   o.as<float>(), nh * hd, hd};
    if (!c.empty()) {
      STRATA_CHECK(T == 1 && (int64_t)c.size() == n0, "backend_attend: a cell list needs T = 1 and n0 = its length");
      for (int32_t x : c) STRATA_CHECK(x >= 0 && x < n, "backend_attend: cell ", x, " outside k/v");
      a.cells = cells.as<int32_t>();
    }
  }
};


// The layer operations (backend.h) for tests: every array of `f` (float32) and `iv` (int32) is copied into the
// backend's memory, the operation runs over them (ints / floats: its scalar arguments, in the order below), and
// every array comes back as it stands after the operation (in-place operations show; outputs are the caller's
// arrays, poisoned with NaN first by the tests).
std::tuple<std::vector<std::vector<float>>, std::vector<std::vector<int32_t>>> layer_op(
    const std::string& bname, const std::string& op, const std::vector<std::vector<float>>& f,
    const std::vector<std::vector<int32_t>>& iv, const std::vector<int64_t>& n, const std::vector<double>& d) {
  Backend& be = backend(bname);
  std::vector<std::unique_ptr<Buf>> fb, ib;
  for (auto& a : f) fb.push_back(std::make_unique<Buf>(be, a.data(), std::max<size_t>(a.size(), 1) * 4));
  for (auto& a : iv) ib.push_back(std::make_unique<Buf>(be, a.data(), std::max<size_t>(a.size(), 1) * 4));
  auto F = [&](size_t i) {
    STRATA_CHECK(i < fb.size(), op, ": float array ", i, " missing");
    return fb[i]->as<float>();
  };
  auto I = [&](size_t i) {
    STRATA_CHECK(i < ib.size(), op, ": int array ", i, " missing");
    return ib[i]->as<int32_t>();
  };
  auto N = [&](size_t i) {
    STRATA_CHECK(i < n.size(), op, ": int argument ", i, " missing");
    return n[i];
  };
  auto D = [&](size_t i) {
    STRATA_CHECK(i < d.size(), op, ": float argument ", i, " missing");
    return (float)d[i];
  };
  if (op == "add") be.add(F(0), F(1), N(0));
  else if (op == "add_rmsnorm") be.add_rmsnorm(F(0), F(1), F(2), N(0), (int)N(1), D(0), F(3), ActKind::Float);
  else if (op == "norm_matmul") {
    // f: x, y, w, out, y1, y2; iv: the weight bytes as int32 words; n: n, T, type, rows, feeds, lanes, touch, first.
    // add_rmsnorm into out (feeds: the ActKind it is told), then in `lanes` lanes of a fork the product of out's rows
    // [first, T) into y1 (lane 0) and y2 (the last lane); touch: out = silu(out) * y between the norm and the
    // products (they must see it: no reuse of the norm's quantization)
    const int64_t n_ = N(0), T = N(1), rows = N(3), first = N(7);
    STRATA_CHECK(N(4) >= 0 && N(4) <= 2 && N(5) >= 1 && N(5) <= 4 && first >= 0 && first < T,
                 "norm_matmul: feeds 0..2, lanes 1..4, first in [0, T); got ", N(4), ", ", N(5), ", ", first);
    const MatView W{reinterpret_cast<const uint8_t*>(I(0)), (uint32_t)N(2), rows, n_, row_bytes((uint32_t)N(2), n_)};
    be.add_rmsnorm(F(0), F(1), F(2), n_, (int)T, D(0), F(3), (ActKind)N(4));
    if (N(6)) be.silu_mul(F(3), F(1), n_ * T);
    be.fork((int)N(5));
    be.lane(0);
    be.matmul(W, F(3) + first * n_, n_, (int)(T - first), F(4), rows);
    be.lane((int)N(5) - 1);
    be.matmul(W, F(3) + first * n_, n_, (int)(T - first), F(5), rows);
    be.join();
  }
  else if (op == "conv_silu") be.conv_silu(F(0), F(1), (int)N(0), N(1), N(2), (int)N(3), F(2));
  else if (op == "dn_conv_gates") {
    // f: raw, state, hist, w_t, ba, ssm_a, dt_bias, out, eg, beta, conv_rows, eg_rows, beta_rows, raw_rows;
    // n: T, cd, K, nk, nv, dk, in_place
    const DnConv a{F(0), F(1), F(2), F(3), (int)N(0), N(1), (int)N(2), F(4), F(5), F(6), N(3), N(4), N(5), F(7), F(8),
                   F(9), N(6) != 0, F(10), F(11), F(12), F(13)};
    be.dn_conv_gates(a);
  }
  else if (op == "dn_gates") be.dn_gates(F(0), N(0), F(1), F(2), F(3), (int)N(1), N(2), N(3), N(4), F(4), F(5));
  else if (op == "dn_heads") {
    // f: S, S_work, k, v, q, eg, beta, o; n: ldk, ldv, ldq, ldo, nk, nv, dk, dv, T, n_src, has_o, has_swork
    const bool has_o = N(10) != 0;
    const DnHeads a{F(2), N(0), F(3), N(1), has_o ? F(4) : nullptr, N(2), F(5), F(6), has_o ? F(7) : nullptr, N(3),
                    N(4), N(5), N(6), N(7)};
    be.dn_heads(F(0), N(11) ? F(1) : nullptr, a, (int)N(8), (int)N(9));
  } else if (op == "gated_norm") be.gated_norm(F(0), F(1), F(2), N(0), (int)N(1), D(0), N(2) != 0, F(3));
  else if (op == "gated_norm_matmul") {
    // f: x, w, z, y, out; iv: the weight bytes as int32 words; n: n, heads, T, sigmoid, type, rows. gated_norm_rows
    // told that the product of the weight (rows x heads * n) reads y next, then that product of y into out
    const int64_t n_ = N(0), heads = N(1), T = N(2), cols = n_ * heads, rows = N(5);
    const MatView W{reinterpret_cast<const uint8_t*>(I(0)), (uint32_t)N(4), rows, cols, row_bytes((uint32_t)N(4), cols)};
    be.gated_norm_rows(F(0), F(1), F(2), n_, (int)heads, (int)T, D(0), N(3) != 0, F(3), act_kind((uint32_t)N(4)));
    be.matmul(W, F(3), cols, (int)T, F(4), rows);
  }
  else if (op == "mul_sigmoid_rows") be.mul_sigmoid_rows(F(0), N(0), F(1), N(1), N(2), (int)N(3));
  else if (op == "silu_mul") be.silu_mul(F(0), F(1), N(0));
  else if (op == "norm_rope")
    be.norm_rope(F(0), N(0), N(1), (int)N(2), (int)N(3), F(1), N(4), D(0), F(2), F(3), N(5), N(6));
  else if (op == "moe_combine")
    be.moe_combine(F(0), F(1), (int)N(0), (int)N(1), N(2), N(3) ? F(2) : nullptr, F(3), F(4), F(5));
  else if (op == "moe_combine_pre") {  // the shared gates issued ahead (moe_shared_gate), then the combine
    be.moe_shared_gate(F(3), F(4), (int)N(0), N(2));
    be.moe_combine(F(0), F(1), (int)N(0), (int)N(1), N(2), F(2), F(3), F(4), F(5));
  } else if (op == "norm_rope_at")  // norm_rope's arguments, the position from iv[0]
    be.norm_rope_at(F(0), N(0), N(1), (int)N(2), (int)N(3), F(1), N(4), D(0), F(2), F(3), N(5), I(0));
  else if (op == "kv_store")  // f: k, v, kc, vc; iv: pos; n: T, width
    be.kv_store(F(0), F(1), (int)N(0), N(1), F(2), F(3), I(0));
  else if (op == "attend_at") {  // f: q [T*nh][hd], k, v [cells][hd], o; iv: n; n: nh, hd, n_cap
    const int64_t nh = N(0), hd = N(1), T = (int64_t)f[0].size() / (nh * hd);
    const AttendArgs a{F(0), nh * hd, hd, (int)T, (int)nh, F(1), F(2), hd, N(2), hd, 1.f / std::sqrt((float)hd),
                       F(3), nh * hd, hd};
    be.attend_at(a, I(0));
  } else if (op == "matmul_seq") {
    // f: x, y1, y2, dx; iv: the weight bytes as int32 words; n: type, rows, cols, T, touch. Two products of x, and
    // between them x += dx when touch (the second must see it: no reuse of the first's quantization)
    const MatView W{reinterpret_cast<const uint8_t*>(I(0)), (uint32_t)N(0), N(1), N(2), row_bytes((uint32_t)N(0), N(2))};
    be.matmul(W, F(0), N(2), (int)N(3), F(1), N(1));
    if (N(4)) be.add(F(0), F(3), N(2) * N(3));
    be.matmul(W, F(0), N(2), (int)N(3), F(2), N(1));
  }
  else if (op == "matmul_pair") {
    // f: x, y1, y2; iv: two weights' bytes as int32 words; n: type1, type2, rows, cols, T. Products of the same rows
    // by weights of two types (of different activation kinds: the second must not reuse the first's quantization)
    const MatView W1{reinterpret_cast<const uint8_t*>(I(0)), (uint32_t)N(0), N(2), N(3), row_bytes((uint32_t)N(0), N(3))};
    const MatView W2{reinterpret_cast<const uint8_t*>(I(1)), (uint32_t)N(1), N(2), N(3), row_bytes((uint32_t)N(1), N(3))};
    be.matmul(W1, F(0), N(3), (int)N(4), F(1), N(2));
    be.matmul(W2, F(0), N(3), (int)N(4), F(2), N(2));
  }
  else if (op == "dn_untile")
    be.dn_untile(F(0), F(1), N(0), N(1), F(2), F(3), F(4), F(5), F(6), I(0), (int)N(2), N(3), N(4), N(5));
  else if (op == "dn_retile") be.dn_retile(F(0), F(1), I(0), (int)N(0), N(1), N(2));
  else if (op == "matmul_sel") {
    // f: x, y; iv: sel, the weight bytes as int32 words; n: type, rows, cols, n_slots, xdiv, ldx, ldy, expert_bytes
    const MatView W0{reinterpret_cast<const uint8_t*>(I(1)), (uint32_t)N(0), N(1), N(2), row_bytes((uint32_t)N(0), N(2))};
    be.matmul_sel(W0, (size_t)N(7), I(0), (int)N(3), (int)N(4), F(0), N(5), F(1), N(6));
  } else if (op == "matmul_sel_swiglu") {
    // f: x, g, u; iv: sel, gate bytes, up bytes (int32 words); n: type, rows, cols, n_slots, xdiv, ldx, expert_bytes
    const MatView Wg{reinterpret_cast<const uint8_t*>(I(1)), (uint32_t)N(0), N(1), N(2), row_bytes((uint32_t)N(0), N(2))};
    const MatView Wu{reinterpret_cast<const uint8_t*>(I(2)), (uint32_t)N(0), N(1), N(2), row_bytes((uint32_t)N(0), N(2))};
    be.matmul_sel_swiglu(Wg, (size_t)N(6), Wu, (size_t)N(6), I(0), (int)N(3), (int)N(4), F(0), N(5), F(1), F(2));
  } else if (op == "moe_experts") {
    // matmul_sel_swiglu, then the down product over the same selection (moe's order: the union reused on the GPU).
    // f: x, g, u, y; iv: sel, gate, up, down bytes; n: type, ff, hidden, n_slots, xdiv, gate / up bytes, down bytes
    const auto rb = [&](int64_t cols) { return row_bytes((uint32_t)N(0), cols); };
    const MatView Wg{reinterpret_cast<const uint8_t*>(I(1)), (uint32_t)N(0), N(1), N(2), rb(N(2))};
    const MatView Wu{reinterpret_cast<const uint8_t*>(I(2)), (uint32_t)N(0), N(1), N(2), rb(N(2))};
    const MatView Wd{reinterpret_cast<const uint8_t*>(I(3)), (uint32_t)N(0), N(2), N(1), rb(N(1))};
    be.matmul_sel_swiglu(Wg, (size_t)N(5), Wu, (size_t)N(5), I(0), (int)N(3), (int)N(4), F(0), N(2), F(1), F(2));
    be.matmul_sel(Wd, (size_t)N(6), I(0), (int)N(3), 1, F(1), N(1), F(3), N(2));
  } else if (op == "moe_route") {
    be.moe_route(F(0), (int)N(0), N(1), (int)N(2), I(0), F(1));
  } else fail<std::invalid_argument>("layer_op: unknown operation '", op, "'");
  be.sync();
  std::vector<std::vector<float>> fo(f.size());
  std::vector<std::vector<int32_t>> io(iv.size());
  for (size_t i = 0; i < f.size(); i++) {
    fo[i].resize(f[i].size());
    if (!f[i].empty()) be.download(fo[i].data(), fb[i]->p, f[i].size() * 4);
  }
  for (size_t i = 0; i < iv.size(); i++) {
    io[i].resize(iv[i].size());
    if (!iv[i].empty()) be.download(io[i].data(), ib[i]->p, iv[i].size() * 4);
  }
  return {fo, io};
}

}  // namespace

void init_cuda(nb::module_& m) {
  m.def("backend_layer_op", &layer_op, nb::arg("backend"), nb::arg("op"), nb::arg("f"), nb::arg("i"), nb::arg("n"),
        nb::arg("d"), "Tests: one layer operation of backend.h on a backend (arrays in, the same arrays back).");
  m.def("cuda_available", &cuda_available, "Whether this build has CUDA and a usable device (never raises).");
  m.def("cuda_info", &cuda_info, "The CUDA runtime, driver and devices, or why none is usable.");
  m.def("backend_name", [](const std::string& b) { return backend(b).name(); }, nb::arg("backend"));
  m.def("recorded_step_replays", &recorded_step_replays);
  m.def(
      "backend_matmul",
      [](const std::string& b, U8 w, const std::string& type, int64_t rows, int64_t cols, F2 x) {
        // y[T, rows] = x[T, cols] @ W^T through Backend::matmul (weights and rows copied into its memory first).
        Backend& be = backend(b);
        const TypeTraits* t = traits_named(type);
        const MatView hw = checked_view(t, w.data(), rows, cols, w.size());
        STRATA_CHECK((int64_t)x.shape(1) == cols && x.shape(0) >= 1, "backend_matmul: x is ", x.shape(0), " x ",
                     x.shape(1), ", expected T x ", cols);
        const int T = (int)x.shape(0);
        float* out;
        OutF2 res = new_out((size_t)T, (size_t)rows, &out);
        nb::gil_scoped_release rel;
        Buf dw(be, hw.data, hw.row_bytes * rows), dx(be, x.data(), x.size() * 4), dy(be, (size_t)T * rows * 4);
        MatView W = hw;
        W.data = dw.as<uint8_t>();
        be.matmul(W, dx.as<float>(), cols, T, dy.as<float>(), rows);
        be.download(out, dy.p, (size_t)T * rows * 4);
        return res;
      },
      nb::arg("backend"), nb::arg("w"), nb::arg("type"), nb::arg("rows"), nb::arg("cols"), nb::arg("x"));
  m.def(
      "backend_rmsnorm",
      [](const std::string& b, F2 x, F1 w, float eps) {
        Backend& be = backend(b);
        const int64_t n = (int64_t)x.shape(1);
        const int T = (int)x.shape(0);
        STRATA_CHECK(T >= 1 && (int64_t)w.shape(0) == n, "backend_rmsnorm: x[T][n], w[n]; got w of ", w.shape(0));
        float* out;
        OutF2 res = new_out((size_t)T, (size_t)n, &out);
        nb::gil_scoped_release rel;
        Buf dx(be, x.data(), x.size() * 4), dw(be, w.data(), w.size() * 4), dy(be, x.size() * 4);
        be.rmsnorm(dx.as<float>(), n, dw.as<float>(), n, T, eps, dy.as<float>(), n, ActKind::Float);
        be.download(out, dy.p, x.size() * 4);
        return res;
      },
      nb::arg("backend"), nb::arg("x"), nb::arg("w"), nb::arg("eps"));
  m.def(
      "cuda_bench_matmul",
      [](U8 w, const std::string& type, int64_t rows, int64_t cols, int nmat, F2 x, std::vector<int> Ts, int reps) {
        // [(median, min) seconds per product] for each T in Ts (rows 0..T-1 of x) on the GPU, rotating over the
        // nmat weights stored back to back in w (uploaded once).
        Backend& be = backend("cuda");
        const TypeTraits* t = traits_named(type);
        STRATA_CHECK(nmat >= 1, "cuda_bench_matmul: nmat = ", nmat);
        checked_view(t, w.data(), rows, cols, w.size() / nmat);
        STRATA_CHECK((int64_t)x.shape(1) == cols, "cuda_bench_matmul: x has ", x.shape(1), " columns, expected ", cols);
        for (int T : Ts) STRATA_CHECK(T >= 1 && T <= (int)x.shape(0), "cuda_bench_matmul: T = ", T, " but x has ", x.shape(0), " rows");
        std::vector<std::tuple<double, double>> out;
        nb::gil_scoped_release rel;
        Buf dw(be, w.data(), row_bytes(t->id, cols) * rows * nmat), dx(be, x.data(), x.size() * 4),
            dy(be, (size_t)x.shape(0) * rows * 4);
        for (int T : Ts) {
          const CudaTiming tm = cuda_time_matmul(be, t->id, rows, cols, dw.as<uint8_t>(), nmat, dx.as<float>(), T,
                                                 dy.as<float>(), reps);
          out.emplace_back(tm.median_s, tm.min_s);
        }
        return out;
      },
      nb::arg("w"), nb::arg("type"), nb::arg("rows"), nb::arg("cols"), nb::arg("nmat"), nb::arg("x"), nb::arg("Ts"),
      nb::arg("reps") = 10);
  m.def("cuda_prefer_mma", &cuda_prefer_mma, nb::arg("on"), nb::arg("min_rows") = 5,
        "Tests and benches: whether the IQ2_XXS products of min_rows+ rows and the expert tiles take the int8 tensor cores "
        "(default on where the card has them) or the dp4a kernels; the same bits either way.");
  m.def("cuda_mma_used", &cuda_mma_used, "Whether those products take the tensor cores now (False without CUDA).");
  m.def("cuda_prefer_pdl", &cuda_prefer_pdl, nb::arg("on"), nb::arg("prefetch") = true, nb::arg("windows") = false,
        "Tests and benches: whether kernels launch with programmatic dependent launch (default on where the card has "
        "it: sm_90+), with it whether the dense products prefetch their weights toward L2 first, and whether the "
        "verify windows of 5..16 rows take it too (default: plain launches there); the same bits every way.");
  m.def("cuda_prefer_norm_quant", &cuda_prefer_norm_quant, nb::arg("on"),
        "Tests and benches: whether the norms quantize their rows for the int8-activation products after them, in the "
        "norm's kernel (default on), or the products do; the same bits either way.");
  m.def("cuda_prefer_iq2_rows", &cuda_prefer_iq2_rows, nb::arg("dense"), nb::arg("sel"), nb::arg("pair"),
        "Tests and benches: the weight rows (1, 2 or 4) a warp of the IQ2_XXS one-row kernel takes in the dense products, "
        "in the experts' products and in the experts' fused gate / up (defaults 1, 4, 1); the same bits every way.");
  m.def("cuda_pdl_used", &cuda_pdl_used, "Whether launches carry programmatic dependent launch now (False without CUDA).");
  m.def("cuda_prefer_iq2_window_u4", &cuda_prefer_iq2_window_u4, nb::arg("on"),
        "Tests and benches: whether the dense IQ2_XXS windows of 2..4 rows take 4 blocks of a weight row a step "
        "(default off: 2); the same bits either way.");
  m.def("cuda_prefer_iq2_panel", &cuda_prefer_iq2_panel, nb::arg("on"),
        "Tests and benches: whether the dense IQ2_XXS products of 32+ rows (prompt pieces) decode a block's 16 weight "
        "rows once into shared memory (default on) or per 16 activation rows; the same bits either way.");
  m.def("cuda_prefer_iq2_panel_staged", &cuda_prefer_iq2_panel_staged, nb::arg("on"),
        "Tests and benches: whether that panel's activation rows are staged in shared memory by cp.async, 16 rows a "
        "warp (default on), or read from L2 word by word, 8 rows a warp; the same bits either way.");
  m.def("cuda_prefer_dn_conv_fused", &cuda_prefer_dn_conv_fused, nb::arg("on"),
        "Tests and benches: whether DeltaNet's causal conv, gates and conv-state (or replay-row) copies of windows of up "
        "to 16 rows run as one kernel (default on) or as the sequence of copies and kernels; the same bits either way.");
  m.def("cuda_prefer_dn_duo", &cuda_prefer_dn_duo, nb::arg("on"),
        "Tests and benches: whether DeltaNet heads (dk = 128) over 2+ rows take the kernel with a column's two halves "
        "on two warps, a row's o sum interleaved with the next row's m (default on) or k_dn_heads_split; the same "
        "bits either way.");
  m.def("cuda_prefer_row_groups", &cuda_prefer_row_groups, nb::arg("on"),
        "Tests and benches: whether small float matrices (the routers) over 17+ rows take blocks of 16 activation rows "
        "or a block per row (the default); the same bits either way.");
  m.def("cuda_prefer_float_split", &cuda_prefer_float_split, nb::arg("bytes"),
        "Tests and benches: float matrices of at most `bytes` (default 8 MiB; 0: none) take windows of 2..8 rows as the "
        "1-row kernel per activation row, not the T-row kernels; the same bits either way.");
  m.def("cuda_prefer_b32q_split", &cuda_prefer_b32q_split, nb::arg("on"),
        "Tests and benches: whether the int8-activation 32-value block types' (Q4_0, Q4_1, Q5_*, IQ4_NL, MXFP4) small "
        "matrices take windows as the 1-row kernel per activation row (default on) or the T-row kernels; the same bits "
        "either way.");
  m.def("cuda_prefer_kq_lanes", &cuda_prefer_kq_lanes, nb::arg("on"),
        "Tests and benches: whether Q4_K's and Q6_K's one-row products (decode steps, the experts' slots, small "
        "matrices' row split) take the dp4a lane kernel (default) or the generic int8 kernel; the same bits either way.");
  m.def("cuda_prefer_kq_pair", &cuda_prefer_kq_pair, nb::arg("on"),
        "Tests and benches: whether the experts' Q4_K / Q5_K / Q6_K gate / up / SwiGLU over a few slots (fewer than the tiles') "
        "is one dp4a lane kernel launch or (default) the two products and silu_mul; the same bits either way.");
  m.def("cuda_prefer_q5k_lanes", &cuda_prefer_q5k_lanes, nb::arg("on"),
        "Tests and benches: whether Q5_K's one-row products take the dp4a lane kernel as Q4_K's do (with "
        "cuda_prefer_kq_lanes) or (default) the generic int8 kernel; the same bits either way.");
  m.def("cuda_prefer_kquant_windows", &cuda_prefer_kquant_windows, nb::arg("on"),
        "Tests and benches: whether small Q4_K / Q5_K / Q6_K matrices over a prompt piece (more than 16 rows) take the "
        "16-row kernel in 256-thread blocks (default) or the 1-row kernel per activation row; the same bits either way.");
  m.def("cuda_prefer_attn_tiles", &cuda_prefer_attn_tiles, nb::arg("on"), nb::arg("min_queries") = 1024,
        "Tests and benches: whether attention over min_queries+ queries (rows x heads of a KV head) takes the tiled "
        "kernels (default on from 1024: prompt pieces) or a block per (row, head); the same bits either way.");
  m.def("cuda_prefer_tile_prefetch", &cuda_prefer_tile_prefetch, nb::arg("on"),
        "Tests and benches: whether the IQ2_XXS expert tiles on the tensor cores prefetch each block's next tile's "
        "weights into L2 (default on); a hint, the same bits either way.");
  m.def("cuda_prefer_float_tiles", &cuda_prefer_float_tiles, nb::arg("on"), nb::arg("min_rows") = 16,
        nb::arg("min_weight_rows") = 4096,
        "Tests and benches: whether float products (F32 / F16 / BF16 / Q8_0: the routers, the default model's head) of "
        "min_rows+ activation rows (default 16, at least 2) take blocks of 32 rows x 32 weight rows staged in shared "
        "memory (default on) or k_float; windows under 32 rows only for matrices of min_weight_rows+ rows (default "
        "4096: the default model's head); the same bits either way.");
  m.def("cuda_prefer_tile_stage", &cuda_prefer_tile_stage, nb::arg("on"),
        "Tests and benches: whether the IQ2_XXS expert tiles on the tensor cores copy each tile's activation rows into "
        "shared memory first (default on); the same bits either way.");
  m.def("cuda_prefer_prompt_rows", &cuda_prefer_prompt_rows, nb::arg("rows"),
        "Tests and benches: the rows of a prompt piece on the card (1..4096, default 512), for the sessions made after "
        "the call; the same bits for any value.");
  m.def("cuda_prompt_rows", &cuda_prompt_rows, "The rows of a prompt piece on the card now.");
  m.def(
      "cuda_bench_launch",
      [](int reps) {
        const CudaTiming t = cuda_time_launch(backend("cuda"), reps);
        return std::make_tuple(t.median_s, t.min_s);
      },
      nb::arg("reps") = 10, "(median, min) seconds per launch of an empty kernel, back to back.");
  m.def(
      "cuda_bench_copy",
      [](size_t bytes, int reps) {
        const CudaTiming t = cuda_time_copy(backend("cuda"), bytes, reps);
        return std::make_tuple(t.median_s, t.min_s);
      },
      nb::arg("bytes"), nb::arg("reps") = 10, "(median, min) seconds per device-to-device copy of `bytes`.");
  m.def(
      "backend_dn_rows",
      [](const std::string& b, F2 S, F2 k, F2 v, F2 q, F2 gates, int n_src, bool read) {
        // Backend::dn_rows of one value head through T rows: (S after rows < n_src, S_work after all rows (NaN where
        // n_src >= T: never written), o[T][dv] (NaN where not read)).
        Backend& be = backend(b);
        check_dn(S, k, v, q, gates, n_src);
        std::vector<float> s0(S.size()), sw(S.size()), o((size_t)k.shape(0) * S.shape(1));
        nb::gil_scoped_release rel;
        DnInputs in(be, S, k, v, q, gates, read);
        be.dn_rows(in.s.as<float>(), in.sw.as<float>(), in.rows.data(), in.T, n_src, in.dk, in.dv);
        be.download(s0.data(), in.s.p, s0.size() * 4);
        be.download(sw.data(), in.sw.p, sw.size() * 4);
        be.download(o.data(), in.o.p, o.size() * 4);
        return std::make_tuple(s0, sw, o);
      },
      nb::arg("backend"), nb::arg("S"), nb::arg("k"), nb::arg("v"), nb::arg("q"), nb::arg("gates"), nb::arg("n_src"),
      nb::arg("read") = true);
  m.def(
      "backend_attend",
      [](const std::string& b, F2 q, int nh, F2 k, F2 v, int64_t n0, float scale, std::vector<int32_t> cells) {
        // Backend::attend: o[T*nh][hd] (as _core.attend).
        Backend& be = backend(b);
        std::vector<float> o(q.size());
        nb::gil_scoped_release rel;
        AttendInputs in(be, q, nh, k, v, n0, scale, cells);
        be.attend(in.a);
        be.download(o.data(), in.o.p, o.size() * 4);
        return o;
      },
      nb::arg("backend"), nb::arg("q"), nb::arg("nh"), nb::arg("k"), nb::arg("v"), nb::arg("n0"), nb::arg("scale"),
      nb::arg("cells") = std::vector<int32_t>{});
  m.def(
      "backend_moe_route",
      [](const std::string& b, F2 logits, int k) {
        // Backend::moe_route of logits[T][E]: (sel[T*k], wt[T*k]).
        Backend& be = backend(b);
        const int T = (int)logits.shape(0);
        const int64_t E = (int64_t)logits.shape(1);
        STRATA_CHECK(T >= 1, "backend_moe_route: logits[T][E] with T >= 1");
        std::vector<int32_t> sel((size_t)T * std::max(k, 0));
        std::vector<float> wt(sel.size());
        nb::gil_scoped_release rel;
        Buf dl(be, logits.data(), logits.size() * 4), ds(be, poisoned(sel.size(), -1).data(), sel.size() * 4),
            dw(be, poisoned(wt.size(), kNaN).data(), wt.size() * 4);
        be.moe_route(dl.as<float>(), T, E, k, ds.as<int32_t>(), dw.as<float>());
        be.download(sel.data(), ds.p, sel.size() * 4);
        be.download(wt.data(), dw.p, wt.size() * 4);
        return std::make_tuple(sel, wt);
      },
      nb::arg("backend"), nb::arg("logits"), nb::arg("k"));
  m.def(
      "backend_argmax_rows",
      [](const std::string& b, F2 logits, int32_t none) {
        // Backend::argmax_rows of logits[T][V]: int32 tokens[T] (`none` where a row has no logit above -inf).
        Backend& be = backend(b);
        const int T = (int)logits.shape(0);
        const int64_t V = (int64_t)logits.shape(1);
        STRATA_CHECK(T >= 1 && V >= 1, "backend_argmax_rows: logits[T][V] with T, V >= 1");
        std::vector<int32_t> out((size_t)T);
        nb::gil_scoped_release rel;
        Buf dl(be, logits.data(), logits.size() * 4), dout(be, poisoned(out.size(), -7).data(), out.size() * 4);
        be.argmax_rows(dl.as<float>(), T, V, none, dout.as<int32_t>());
        be.download(out.data(), dout.p, out.size() * 4);
        return out;
      },
      nb::arg("backend"), nb::arg("logits"), nb::arg("none") = 0);
  m.def(
      "backend_embed_rows",
      [](const std::string& b, const std::string& type, U8 table, int64_t cols, I1 ids) {
        // Backend::embed_rows of a table of `type` (its GGUF bytes, rows of cols values): float32 [T][cols].
        Backend& be = backend(b);
        const TypeTraits* tt = traits_named(type);
        const size_t rb = row_bytes(tt->id, cols);
        STRATA_CHECK(cols % tt->block_size == 0 && rb > 0 && table.size() % rb == 0, "backend_embed_rows: ",
                     table.size(), " bytes are no whole rows of ", cols, " ", type, " values");
        STRATA_CHECK(be.can_embed(tt->id), "backend_embed_rows: backend ", be.name(), " does not embed ", type);
        const int T = (int)ids.shape(0);
        const MatView W0{nullptr, tt->id, (int64_t)(table.size() / rb), cols, rb};
        for (int t = 0; t < T; t++)
          STRATA_CHECK(ids.data()[t] >= 0 && ids.data()[t] < W0.rows, "backend_embed_rows: id ", ids.data()[t],
                       " outside [0, ", W0.rows, ")");
        std::vector<float> out((size_t)T * cols);
        nb::gil_scoped_release rel;
        Buf dt(be, table.data(), table.size()), di(be, ids.data(), (size_t)T * 4),
            dout(be, poisoned(out.size(), kNaN).data(), out.size() * 4);
        MatView W = W0;
        W.data = dt.as<uint8_t>();
        be.embed_rows(W, di.as<int32_t>(), T, dout.as<float>());
        be.download(out.data(), dout.p, out.size() * 4);
        return out;
      },
      nb::arg("backend"), nb::arg("type"), nb::arg("table"), nb::arg("cols"), nb::arg("ids"));
  m.def(
      "backend_sample_rows",
      [](const std::string& b, F2 logits, const SamplingParams& p, I1 committed, I1 inputs, int64_t pos0) {
        // Backend::sample_rows (as _core.sample_rows): int32 tokens[T].
        Backend& be = backend(b);
        const int T = (int)logits.shape(0);
        const int64_t V = (int64_t)logits.shape(1);
        STRATA_CHECK((int)inputs.shape(0) == T, "backend_sample_rows: logits has ", T, " rows but inputs has ",
                     inputs.shape(0), " tokens");
        std::vector<int32_t> out((size_t)T);
        nb::gil_scoped_release rel;
        Buf dl(be, logits.data(), logits.size() * 4), dc(be, committed.data(), committed.size() * 4),
            di(be, inputs.data(), inputs.size() * 4), dout(be, poisoned(out.size(), -1).data(), out.size() * 4);
        be.sample_rows(dl.as<float>(), T, V, p, dc.as<int32_t>(), (int64_t)committed.shape(0), di.as<int32_t>(), pos0,
                       dout.as<int32_t>());
        be.download(out.data(), dout.p, out.size() * 4);
        return out;
      },
      nb::arg("backend"), nb::arg("logits"), nb::arg("params"), nb::arg("committed"), nb::arg("inputs"),
      nb::arg("pos0"));
  m.def(
      "cuda_bench_dn_rows",
      [](int64_t dk, int64_t dv, int heads, std::vector<int> Ts, int n_src_mode, int reps) {
        // [(median, min) seconds per call] of Backend::dn_rows for each T on the GPU, over `heads` distinct states
        // (one head per call, as the model calls it). n_src_mode: 0 = in place (n_src = T), 1 = verify (n_src = 0).
        Backend& be = backend("cuda");
        const int Tmax = *std::max_element(Ts.begin(), Ts.end());
        std::vector<float> h((size_t)heads * dk * dv), hk((size_t)Tmax * dk), hv((size_t)Tmax * dv);
        uint32_t x = 12345;
        auto rnd = [&] { x = x * 1664525u + 1013904223u; return (float)(x >> 8) / 16777216.f - 0.5f; };
        for (auto& f : h) f = rnd() * 0.1f;
        for (auto& f : hk) f = rnd() * 0.1f;
        for (auto& f : hv) f = rnd();
        std::vector<std::tuple<double, double>> out;
        nb::gil_scoped_release rel;
        Buf S(be, h.data(), h.size() * 4), W(be, h.size() * 4), K(be, hk.data(), hk.size() * 4),
            Q(be, hk.data(), hk.size() * 4), Vv(be, hv.data(), hv.size() * 4), O(be, (size_t)Tmax * dv * 4);
        for (int T : Ts) {
          std::vector<DnRow> rows;
          for (int t = 0; t < T; t++)
            rows.push_back({K.as<float>() + t * dk, Vv.as<float>() + t * dv, Q.as<float>() + t * dk, 0.99f, 0.5f,
                            O.as<float>() + t * dv});
          const CudaTiming tm = cuda_time_calls(be, heads, reps, [&](int i) {
            be.dn_rows(S.as<float>() + (size_t)i * dk * dv, W.as<float>() + (size_t)i * dk * dv, rows.data(), T,
                       n_src_mode == 0 ? T : 0, dk, dv);
          });
          out.emplace_back(tm.median_s, tm.min_s);
        }
        return out;
      },
      nb::arg("dk"), nb::arg("dv"), nb::arg("heads"), nb::arg("Ts"), nb::arg("n_src_mode") = 0, nb::arg("reps") = 10);
  m.def(
      "cuda_bench_attend",
      [](int64_t n, int nh, int64_t hd, int kv_heads, std::vector<int> Ts, int reps) {
        // [(median, min) seconds per call] of Backend::attend (T rows x nh query heads over one KV head's n cells)
        // for each T, rotating over kv_heads distinct caches of n + max(T) cells.
        Backend& be = backend("cuda");
        const int Tmax = *std::max_element(Ts.begin(), Ts.end());
        const int64_t cells = n + Tmax;
        std::vector<float> kv((size_t)cells * hd), hq((size_t)Tmax * nh * hd);
        uint32_t x = 777;
        auto rnd = [&] { x = x * 1664525u + 1013904223u; return (float)(x >> 8) / 16777216.f - 0.5f; };
        for (auto& f : kv) f = rnd();
        for (auto& f : hq) f = rnd();
        std::vector<std::tuple<double, double>> out;
        nb::gil_scoped_release rel;
        Buf K(be, (size_t)kv_heads * kv.size() * 4), Vv(be, (size_t)kv_heads * kv.size() * 4),
            Q(be, hq.data(), hq.size() * 4), O(be, hq.size() * 4);
        for (int i = 0; i < kv_heads; i++) {
          be.upload(K.as<float>() + (size_t)i * kv.size(), kv.data(), kv.size() * 4);
          be.upload(Vv.as<float>() + (size_t)i * kv.size(), kv.data(), kv.size() * 4);
        }
        for (int T : Ts) {
          const CudaTiming tm = cuda_time_calls(be, kv_heads, reps, [&](int i) {
            const AttendArgs a{Q.as<float>(), nh * hd, hd, T, nh, K.as<float>() + (size_t)i * kv.size(),
                               Vv.as<float>() + (size_t)i * kv.size(), hd, n, hd, 0.0625f, O.as<float>(), nh * hd, hd};
            be.attend(a);
          });
          out.emplace_back(tm.median_s, tm.min_s);
        }
        return out;
      },
      nb::arg("n"), nb::arg("nh"), nb::arg("hd"), nb::arg("kv_heads"), nb::arg("Ts"), nb::arg("reps") = 10);
  m.def(
      "cuda_bench_route",
      [](F2 logits, int k, int reps) {
        // (median, min) seconds per Backend::moe_route of logits[T][E] on the GPU.
        Backend& be = backend("cuda");
        const int T = (int)logits.shape(0);
        const int64_t E = (int64_t)logits.shape(1);
        nb::gil_scoped_release rel;
        Buf dl(be, logits.data(), logits.size() * 4), ds(be, (size_t)T * k * 4), dw(be, (size_t)T * k * 4);
        const CudaTiming tm = cuda_time_calls(be, 20, reps, [&](int) {
          be.moe_route(dl.as<float>(), T, E, k, ds.as<int32_t>(), dw.as<float>());
        });
        return std::make_tuple(tm.median_s, tm.min_s);
      },
      nb::arg("logits"), nb::arg("k"), nb::arg("reps") = 10);
  m.def(
      "cuda_bench_sample",
      [](F2 logits, const SamplingParams& p, int reps) {
        // (median, min) seconds per Backend::sample_rows of logits[T][V] on the GPU (each call waits for its
        // tokens: the window finish is synchronous). History: T tokens, none committed.
        Backend& be = backend("cuda");
        const int T = (int)logits.shape(0);
        const int64_t V = (int64_t)logits.shape(1);
        std::vector<int32_t> in((size_t)T);
        for (int t = 0; t < T; t++) in[t] = (int32_t)(t * 7919 % V);
        nb::gil_scoped_release rel;
        Buf dl(be, logits.data(), logits.size() * 4), di(be, in.data(), in.size() * 4), dout(be, (size_t)T * 4);
        const CudaTiming tm = cuda_time_calls(be, 5, reps, [&](int i) {
          be.sample_rows(dl.as<float>(), T, V, p, nullptr, 0, di.as<int32_t>(), 100 + i, dout.as<int32_t>());
        });
        return std::make_tuple(tm.median_s, tm.min_s);
      },
      nb::arg("logits"), nb::arg("params"), nb::arg("reps") = 10);
}
