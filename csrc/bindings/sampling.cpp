// Python bindings for the sampler (csrc/sampling/sampler.h): SamplingParams and the four entry points.
// Tokens cross as int32 arrays, logits as float32 arrays; sample_rows releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <sstream>

#include "sampling/sampler.h"
#include "util/common.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using strata::SamplingParams;
template <class T, class... Extra>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu, Extra...>;
template <class T>
using Out1 = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A fresh 1-D numpy array of n elements, owned by a capsule.
template <class T>
Out1<T> new_array(size_t n, T** data) {
  T* p = new T[n > 0 ? n : 1];
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
  *data = p;
  return Out1<T>(p, {n}, owner);
}

std::string repr(const SamplingParams& p) {
  std::ostringstream os;
  os << "SamplingParams(temperature=" << p.temperature << ", top_k=" << p.top_k << ", top_p=" << p.top_p
     << ", min_p=" << p.min_p << ", repetition_penalty=" << p.repetition_penalty
     << ", presence_penalty=" << p.presence_penalty << ", frequency_penalty=" << p.frequency_penalty
     << ", penalty_last_n=" << p.penalty_last_n << ", seed=" << p.seed << ")";
  return os.str();
}

}  // namespace

void init_sampling(nb::module_& m) {
  const SamplingParams d;
  nb::class_<SamplingParams>(m, "SamplingParams",
                             "Logit processors and token choice (engine spec section 5). temperature 0 = greedy.")
      .def(
          "__init__",
          [](SamplingParams* self, float temperature, int32_t top_k, float top_p, float min_p,
             float repetition_penalty, float presence_penalty, float frequency_penalty, int32_t penalty_last_n,
             uint64_t seed) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            p.repetition_penalty = repetition_penalty;
            p.presence_penalty = presence_penalty;
            p.frequency_penalty = frequency_penalty;
            p.penalty_last_n = penalty_last_n;
            p.seed = seed;
            p.validate();  // fail at construction, naming the field
            new (self) SamplingParams(p);
          },
          nb::kw_only(), "temperature"_a = d.temperature, "top_k"_a = d.top_k, "top_p"_a = d.top_p,
          "min_p"_a = d.min_p, "repetition_penalty"_a = d.repetition_penalty,
          "presence_penalty"_a = d.presence_penalty, "frequency_penalty"_a = d.frequency_penalty,
          "penalty_last_n"_a = d.penalty_last_n, "seed"_a = d.seed)
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("penalty_last_n", &SamplingParams::penalty_last_n)
      .def_rw("seed", &SamplingParams::seed)
      .def("validate", &SamplingParams::validate, "Raise ValueError naming the first bad field.")
      .def("penalties_active", &SamplingParams::penalties_active)
      .def("__repr__", &repr);

  m.def("uniform_at", &strata::uniform_at, "seed"_a, "pos"_a,
        "The uniform in [0, 1) that sampling uses at absolute position pos: a pure function of (seed, pos).");

  m.def(
      "apply_penalties",
      [](In<float, nb::ndim<1>> logits, const SamplingParams& p, In<int32_t, nb::ndim<1>> hist) {
        const size_t V = logits.shape(0);
        float* out;
        auto arr = new_array<float>(V, &out);
        if (V > 0) std::memcpy(out, logits.data(), V * sizeof(float));
        strata::apply_penalties(out, (int64_t)V, p, hist.data(), (int64_t)hist.shape(0));
        return arr;
      },
      "logits"_a, "params"_a, "hist"_a,
      "Penalised copy of logits [V] from the history's last penalty_last_n tokens (the input is not modified).");

  m.def(
      "pick_token",
      [](In<float, nb::ndim<1>> logits, const SamplingParams& p, int64_t pos) {
        return strata::pick_token(logits.data(), (int64_t)logits.shape(0), p, pos);  // reads the row only
      },
      "logits"_a, "params"_a, "pos"_a,
      "Token for absolute position pos from processed logits [V] (the input is not modified).");

  m.def(
      "pick_traced",
      [](In<float, nb::ndim<1>> logits, const SamplingParams& p, int64_t pos, int32_t cap, nb::object allowed) {
        strata::PickTrace tr;
        const int32_t t = strata::pick_token(logits.data(), (int64_t)logits.shape(0), p, pos, &tr, cap);
        nb::object re = nb::none();
        if (!allowed.is_none()) {
          const nb::bytes b = nb::cast<nb::bytes>(allowed);
          re = nb::int_(strata::repick(tr, reinterpret_cast<const uint8_t*>(b.c_str()), (int64_t)b.size()));
        }
        return nb::make_tuple(t, (int)tr.kind, tr.ids, re);
      },
      "logits"_a, "params"_a, "pos"_a, "cap"_a, "allowed"_a.none() = nb::none(),
      "pick_token with its trace (sampler.h PickTrace): (token, kind, candidate ids, repick or None). kind: 0 =\n"
      "more than cap candidates, 1 = check (stands if all allowed), 2 = complete; allowed (bytes, one per\n"
      "candidate): the repick under a mask allowing exactly those.");

  m.def(
      "sample_rows",
      [](In<float, nb::ndim<2>> logits, const SamplingParams& p, In<int32_t, nb::ndim<1>> committed,
         In<int32_t, nb::ndim<1>> inputs, int64_t pos0) {
        const size_t T = logits.shape(0), V = logits.shape(1);
        STRATA_CHECK(inputs.shape(0) == T, "sample_rows: logits has ", T, " rows but inputs has ", inputs.shape(0),
                     " tokens");
        STRATA_CHECK(T <= (size_t)INT32_MAX, "sample_rows: too many rows: ", T);
        int32_t* out;
        auto arr = new_array<int32_t>(T, &out);
        {
          nb::gil_scoped_release nogil;
          strata::sample_rows(logits.data(), (int)T, (int64_t)V, p, committed.data(), (int64_t)committed.shape(0),
                              inputs.data(), pos0, out);
        }
        return arr;
      },
      "logits"_a, "params"_a, "committed"_a, "inputs"_a, "pos0"_a,
      "Window finish: int32 [T]; row i predicts position pos0+i+1 with penalty history "
      "committed ++ inputs[:i+1]. logits [T, V] float32 is not modified.");
}
