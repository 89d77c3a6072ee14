// Model and Session for Python. Tokens cross as int32 arrays, logits as float32 arrays; the GIL is
// released inside run().
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "strata.h"

namespace nb = nanobind;
using namespace strata;

using I32 = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <class T>
static nb::ndarray<nb::numpy, T> to_numpy(const T* src, std::vector<size_t> shape) {
  size_t n = 1;
  for (auto s : shape) n *= s;
  T* out = new T[n ? n : 1];
  if (n) std::memcpy(out, src, n * sizeof(T));
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(out, shape.size(), shape.data(), owner);
}

static FoldMode parse_fold(const std::string& s) {
  if (s == "lazy") return FoldMode::Lazy;
  if (s == "eager") return FoldMode::Eager;
  if (s == "partial") return FoldMode::Partial;
  fail<std::invalid_argument>("bad option fold='", s, "': expected 'lazy', 'eager' or 'partial'");
}
static const char* fold_name(FoldMode f) {
  return f == FoldMode::Lazy ? "lazy" : f == FoldMode::Eager ? "eager" : "partial";
}

static nb::dict config_dict(const HParams& h) {
  nb::dict d;
  d["n_vocab"] = h.n_vocab;
  d["n_embd"] = h.n_embd;
  d["n_layer"] = h.n_layer;
  d["n_ctx_train"] = h.n_ctx_train;
  d["n_head"] = h.n_head;
  d["n_head_kv"] = h.n_head_kv;
  d["head_dim"] = h.head_dim;
  d["n_rot"] = h.n_rot;
  d["rope_theta"] = h.rope_theta;
  d["rms_eps"] = h.rms_eps;
  d["n_expert"] = h.n_expert;
  d["n_expert_used"] = h.n_expert_used;
  d["n_ff_exp"] = h.n_ff_exp;
  d["n_ff_shexp"] = h.n_ff_shexp;
  d["ssm_d_conv"] = h.ssm_d_conv;
  d["ssm_d_state"] = h.ssm_d_state;
  d["ssm_n_group"] = h.ssm_n_group;
  d["ssm_dt_rank"] = h.ssm_dt_rank;
  d["ssm_d_inner"] = h.ssm_d_inner;
  d["full_attention_interval"] = h.full_attn_interval;
  d["n_nextn"] = h.n_nextn;
  nb::list rec;
  for (bool r : h.recurrent) rec.append(r);
  d["recurrent"] = rec;
  return d;
}

void init_model(nb::module_& m) {
  nb::class_<Model>(m, "Model")
      .def_static(
          "load",
          [](const std::string& path, int threads, const std::string& mtp_path) {
            ModelOptions o;
            o.threads = threads;
            o.mtp_path = mtp_path;
            return Model::load(path, o);
          },
          nb::arg("path"), nb::arg("threads") = 0, nb::arg("mtp_path") = "",
          "Open, validate and map a qwen3next GGUF (and optionally a separate MTP-only GGUF).")
      .def_prop_ro("config", [](const Model& mo) { return config_dict(mo.hp()); })
      .def_prop_ro("threads", &Model::threads)
      .def_prop_ro("fingerprint", &Model::fingerprint)
      .def_prop_ro("path", [](const Model& mo) { return mo.file().path(); })
      .def_prop_ro("has_mtp", [](const Model& mo) { return mo.weights().mtp.present; })
      .def_prop_ro("dn_layout", [](const Model& mo) {
        for (const auto& l : mo.weights().layers)
          if (l.recurrent) return std::string(l.dn.legacy ? "legacy" : "current");
        return std::string("none");
      })
      .def("summary", [](const Model& mo) { return mo.hp().summary(); });

  nb::class_<Checkpoint>(m, "Checkpoint")
      .def_prop_ro("position", [](const Checkpoint& c) { return c.position; });

  nb::class_<Session>(m, "Session")
      .def(
          "__init__",
          [](Session* s, std::shared_ptr<Model> model, int64_t n_ctx, int max_window, const std::string& fold, bool mtp) {
            SessionOptions o;
            o.mtp = mtp;
            o.n_ctx = n_ctx;
            o.max_window = max_window;
            o.fold = parse_fold(fold);
            new (s) Session(model, o);
          },
          nb::arg("model"), nb::arg("n_ctx") = 4096, nb::arg("max_window") = 8, nb::arg("fold") = "lazy",
          nb::arg("mtp") = false)
      .def_prop_ro("position", &Session::position)
      .def_prop_ro("n_ctx", &Session::n_ctx)
      .def_prop_ro("max_window", [](const Session& s) { return s.options().max_window; })
      .def_prop_ro("fold", [](const Session& s) { return std::string(fold_name(s.options().fold)); })
      .def_prop_ro("tokens", [](const Session& s) { return s.tokens(); })
      .def_prop_ro("pending_commit", &Session::pending_commit)
      .def_prop_ro("pending_fold", &Session::pending_fold)
      .def_prop_ro("last_fold_seconds", &Session::last_fold_seconds)
      .def(
          "run",
          [](Session& s, I32 tokens, bool last_only) {
            const int T = (int)tokens.shape(0);
            {
              nb::gil_scoped_release rel;
              s.run(tokens.data(), T, last_only);
            }
            const size_t rows = last_only ? 1 : (size_t)T;
            return to_numpy<float>(s.logits(), {rows, (size_t)s.logits_cols()});
          },
          nb::arg("tokens"), nb::arg("last_only") = false)
      .def("hidden", [](const Session& s) { return to_numpy<float>(s.hidden(), {(size_t)s.hidden_rows(), (size_t)s.hidden_cols()}); })
      .def(
          "mtp_draft",
          [](Session& s, int32_t root, int k) {
            std::vector<int32_t> d;
            {
              nb::gil_scoped_release rel;
              d = s.mtp_draft(root, k);
            }
            return d;
          },
          nb::arg("root"), nb::arg("k"), "After commit: k greedy drafts from the MTP block (see strata.h).")
      .def_prop_ro("mtp_position", &Session::mtp_position)
      .def("mtp_logits", [](const Session& s) {
        const auto& l = s.mtp_logits();
        const size_t V = (size_t)s.logits_cols();
        return to_numpy<float>(l.data(), {l.size() / V, V});
      }, "Logits of each draft step of the last mtp_draft [k, n_vocab] (for tests).")
      .def_prop_ro("mtp", [](const Session& s) { return s.options().mtp; })
      .def(
          "sample",
          [](const Session& s, const SamplingParams& p) {
            std::vector<int32_t> out;
            {
              nb::gil_scoped_release rel;
              out = s.sample(p);
            }
            return to_numpy<int32_t>(out.data(), {out.size()});
          },
          nb::arg("params"))
      .def("commit", &Session::commit, nb::arg("keep"))
      .def("flush", &Session::flush)
      .def("reset", &Session::reset)
      .def("checkpoint", &Session::checkpoint)
      .def("restore", &Session::restore, nb::arg("checkpoint"))
      .def("save", &Session::save, nb::arg("path"))
      .def("load", &Session::load, nb::arg("path"))
      .def("export_state", [](Session& s) {
        nb::dict d;
        for (auto& [k, v] : s.export_state()) d[nb::str(k.data(), k.size())] = to_numpy<float>(v.data(), {v.size()});
        return d;
      });
}
