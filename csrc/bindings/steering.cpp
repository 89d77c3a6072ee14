// Python bindings for steering (csrc/sampling/processor.h): the phrase automaton, the Steering object a
// Session is given (with the DRY penalty, dry.h), and the token-mask kernels with their scalar twins (for tests).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "sampling/processor.h"
#include "sampling/token_mask.h"
#include "util/common.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace strata;

namespace {

template <class T, class... Extra>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu, Extra...>;

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> array_of(const std::vector<T>& v) {
  T* p = new T[v.size() ? v.size() : 1];
  if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(p, {v.size()}, owner);
}

void check_mask(size_t V, size_t words, const char* fn) {
  STRATA_CHECK(words == (size_t)mask_words((int64_t)V), fn, ": a mask for ", V, " tokens has ", mask_words((int64_t)V),
               " words, got ", words);
}

}  // namespace

void init_steering(nb::module_& m) {
  nb::class_<PhraseAutomaton>(m, "PhraseAutomaton",
                              "Aho-Corasick automaton over token ids for anti-slop phrase penalties "
                              "(csrc/sampling/phrase_automaton.h).")
      .def(
          "__init__",
          [](PhraseAutomaton* self, std::vector<std::vector<int32_t>> patterns, std::vector<float> strengths,
             In<uint8_t, nb::ndim<1>> flags) {
            std::vector<uint8_t> f(flags.data(), flags.data() + flags.shape(0));
            nb::gil_scoped_release rel;
            new (self) PhraseAutomaton(patterns, strengths, std::move(f));
          },
          "patterns"_a, "strengths"_a, "flags"_a,
          "patterns: token-id sequences; strengths (> 0, inf = ban); flags: uint8 [n_vocab] PhraseTokenFlag bits.")
      .def(
          "step",
          [](const PhraseAutomaton& a, std::pair<int32_t, int> s, int32_t token) {
            STRATA_CHECK(s.first >= 0 && s.first < a.n_nodes(), "step: node ", s.first, " out of range");
            const PhraseState r = a.step(PhraseState{s.first, (uint8_t)(s.second != 0)}, token);
            return std::make_pair(r.node, (int)r.boundary);
          },
          "state"_a, "token"_a, "The state (node, boundary) after `token`.")
      .def(
          "penalties",
          [](const PhraseAutomaton& a, std::pair<int32_t, int> s) {
            STRATA_CHECK(s.first >= 0 && s.first < a.n_nodes(), "penalties: node ", s.first, " out of range");
            std::vector<int32_t> ids;
            std::vector<float> pen;
            a.penalties(PhraseState{s.first, (uint8_t)(s.second != 0)}, ids, pen);
            return std::make_pair(array_of(ids), array_of(pen));
          },
          "state"_a, "(ids, penalties) of the row whose state is (node, boundary); inf = banned.")
      .def_prop_ro("n_nodes", &PhraseAutomaton::n_nodes)
      .def_prop_ro("n_patterns", &PhraseAutomaton::n_patterns)
      .def_prop_ro("n_vocab", &PhraseAutomaton::n_vocab)
      .def_prop_ro("dense", [](const PhraseAutomaton& a) { return a.static_penalties(0) != nullptr; },
                   "Whether the static part of the penalties is applied densely (many single-token phrases).")
      .def_ro_static("BAN_RAMP", &PhraseAutomaton::kBanRamp);

  nb::class_<DryPenalty>(m, "DryPenalty", "The DRY sequence-repetition penalty (csrc/sampling/dry.h).")
      .def(
          "__init__",
          [](DryPenalty* self, float multiplier, float base, int32_t allowed_length, int32_t penalty_last_n,
             std::vector<int32_t> heads, std::vector<std::vector<int32_t>> tails, int64_t n_vocab) {
            new (self) DryPenalty(DryPenalty::make(multiplier, base, allowed_length, penalty_last_n, heads, tails,
                                                   n_vocab));
          },
          "multiplier"_a, "base"_a, "allowed_length"_a, "penalty_last_n"_a, "heads"_a, "tails"_a, "n_vocab"_a,
          "Breakers as llama.cpp processes them: heads[i] is a breaker's first token, tails[i] the tokens after it.")
      .def(
          "penalties",
          [](const DryPenalty& d, In<int32_t, nb::ndim<1>> history) {
            std::vector<int32_t> ids;
            std::vector<float> amounts;
            d.penalties(history.data(), (int64_t)history.shape(0), ids, amounts);
            return std::make_pair(array_of(ids), array_of(amounts));
          },
          "history"_a, "(ids ascending, amounts subtracted) for a row whose history is `history` (int32 [n]).")
      .def_prop_ro("active", &DryPenalty::active);

  nb::class_<Steering>(m, "Steering", "One generation's C++ logit processors (csrc/sampling/processor.h).")
      .def(
          "__init__",
          [](Steering* self, int64_t n_vocab, std::vector<int32_t> bias_ids, std::vector<float> bias_values,
             std::shared_ptr<PhraseAutomaton> phrases, std::shared_ptr<DryPenalty> dry) {
            STRATA_CHECK(n_vocab > 0, "Steering: n_vocab must be > 0, got ", n_vocab);
            if (phrases)
              STRATA_CHECK(phrases->n_vocab() == n_vocab, "Steering: the phrase automaton was built for ",
                           phrases->n_vocab(), " tokens, not ", n_vocab);
            if (dry)
              STRATA_CHECK((int64_t)dry->single_breaker.size() == n_vocab, "Steering: the DRY penalty was built for ",
                           dry->single_breaker.size(), " tokens, not ", n_vocab);
            new (self) Steering{n_vocab, LogitBias::make(bias_ids, bias_values, n_vocab), phrases, dry};
          },
          "n_vocab"_a, "bias_ids"_a, "bias_values"_a, "phrases"_a.none() = nb::none(), "dry"_a.none() = nb::none())
      .def_prop_ro("n_vocab", [](const Steering& s) { return s.n_vocab; })
      .def_prop_ro("has_phrases", [](const Steering& s) { return s.phrases != nullptr; })
      .def_prop_ro("has_dry", [](const Steering& s) { return s.dry_active(); });

  m.def(
      "apply_token_mask",
      [](In<float, nb::ndim<1>> logits, In<uint32_t, nb::ndim<1>> mask, bool ref) {
        const size_t V = logits.shape(0);
        check_mask(V, mask.shape(0), "apply_token_mask");
        std::vector<float> row(logits.data(), logits.data() + V);
        (ref ? apply_token_mask_ref : apply_token_mask)(row.data(), (int64_t)V, mask.data());
        return array_of(row);
      },
      "logits"_a, "mask"_a, "ref"_a = false, "Masked copy of logits [V] (-inf where the bit is 0); ref: scalar twin.");
  m.def(
      "masked_argmax",
      [](In<float, nb::ndim<1>> logits, In<uint32_t, nb::ndim<1>> mask, bool ref) {
        const size_t V = logits.shape(0);
        check_mask(V, mask.shape(0), "masked_argmax");
        return (ref ? masked_argmax_ref : masked_argmax)(logits.data(), (int64_t)V, mask.data());
      },
      "logits"_a, "mask"_a, "ref"_a = false, "Lowest id among the largest allowed non-NaN logits (-1: none); ref: twin.");
  m.def(
      "masked_argmax_sub",
      [](In<float, nb::ndim<1>> logits, In<float, nb::ndim<1>> sub, In<uint32_t, nb::ndim<1>> mask, bool ref) {
        const size_t V = logits.shape(0);
        check_mask(V, mask.shape(0), "masked_argmax_sub");
        STRATA_CHECK(sub.shape(0) == V, "masked_argmax_sub: ", sub.shape(0), " penalties for ", V, " logits");
        return (ref ? masked_argmax_sub_ref : masked_argmax_sub)(logits.data(), sub.data(), (int64_t)V, mask.data());
      },
      "logits"_a, "sub"_a, "mask"_a, "ref"_a = false, "masked_argmax of logits - sub (not written); ref: twin.");
}
