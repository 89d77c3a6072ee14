// The backend interface and the CUDA backend for tests and benches: products and norms through a chosen backend
// ("cpu" or "cuda"), device timing. A build without CUDA answers cuda_available() False and raises RuntimeError
// (naming the CMake option) from everything that needs the GPU.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_bench.h"
#include "kernels/types.h"
#include "util/common.h"

namespace nb = nanobind;
using namespace strata;

using U8 = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using F1 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F2 = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OutF2 = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

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

}  // namespace

void init_cuda(nb::module_& m) {
  m.def("cuda_available", &cuda_available, "Whether this build has CUDA and a usable device (never raises).");
  m.def("cuda_info", &cuda_info, "The CUDA runtime, driver and devices, or why none is usable.");
  m.def("backend_name", [](const std::string& b) { return backend(b).name(); }, nb::arg("backend"));
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
        be.rmsnorm(dx.as<float>(), n, dw.as<float>(), n, T, eps, dy.as<float>(), n);
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
}
