// Python bindings for the suffix-lookup indexes (csrc/drafting/suffix_index.h). Lookups are microseconds,
// so they keep the GIL; GlobalSuffixIndex also locks its own mutex.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sstream>

#include "drafting/suffix_index.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using strata::GlobalSuffixIndex;
using strata::SuffixIndex;
using strata::SuffixMatch;
using strata::SuffixParams;

SuffixParams params(int32_t min_match, int32_t max_match, int32_t max_candidates) {
  SuffixParams p;
  p.min_match = min_match;
  p.max_match = max_match;
  p.max_candidates = max_candidates;
  p.validate();
  return p;
}

}  // namespace

void init_drafting(nb::module_& m) {
  const SuffixParams d;
  nb::class_<SuffixMatch>(m, "SuffixMatch", "Result of a suffix lookup: drafts, match length, frequency.")
      .def_ro("drafts", &SuffixMatch::drafts, "continuation of the chosen earlier occurrence")
      .def_ro("match_length", &SuffixMatch::match_length, "matched suffix tokens (0 = no match)")
      .def_ro("frequency", &SuffixMatch::frequency, "equally long matches followed by the same next token")
      .def_ro("position", &SuffixMatch::position, "where the matched occurrence ends (-1 = no match)")
      .def_ro("work", &SuffixMatch::work, "occurrences visited + tokens compared (the lookup's cost)")
      .def("__bool__", [](const SuffixMatch& r) { return r.match_length > 0; })
      .def("__repr__", [](const SuffixMatch& r) {
        std::ostringstream os;
        os << "SuffixMatch(match_length=" << r.match_length << ", frequency=" << r.frequency
           << ", position=" << r.position << ", drafts=" << r.drafts.size() << " tokens)";
        return os.str();
      });

  nb::class_<SuffixIndex>(m, "SuffixIndex",
                          "One request's tokens, indexed incrementally (amortised O(1) per token) for suffix lookup.")
      .def(
          "__init__",
          [](SuffixIndex* self, int32_t min_match, int32_t max_match, int32_t max_candidates) {
            new (self) SuffixIndex(params(min_match, max_match, max_candidates));
          },
          nb::kw_only(), "min_match"_a = d.min_match, "max_match"_a = d.max_match,
          "max_candidates"_a = d.max_candidates)
      .def("append", &SuffixIndex::append, "tok"_a)
      .def(
          "extend", [](SuffixIndex& s, const std::vector<int32_t>& t) { s.extend(t.data(), t.size()); }, "tokens"_a)
      .def("lookup", &SuffixIndex::lookup, "max_drafts"_a,
           "Continuation (<= max_drafts) of the longest earlier occurrence of the current suffix; ties by "
           "frequency, then recency.")
      .def("clear", &SuffixIndex::clear)
      .def("__len__", &SuffixIndex::size)
      .def_prop_ro("tokens", &SuffixIndex::tokens)
      .def_prop_ro("min_match", [](const SuffixIndex& s) { return s.params().min_match; })
      .def_prop_ro("max_match", [](const SuffixIndex& s) { return s.params().max_match; })
      .def_prop_ro("max_candidates", [](const SuffixIndex& s) { return s.params().max_candidates; });

  nb::class_<GlobalSuffixIndex>(m, "GlobalSuffixIndex",
                                "Earlier requests' outputs in a bounded token budget, oldest evicted first.")
      .def(
          "__init__",
          [](GlobalSuffixIndex* self, size_t capacity_tokens, int32_t min_match, int32_t max_match,
             int32_t max_candidates) {
            new (self) GlobalSuffixIndex(capacity_tokens, params(min_match, max_match, max_candidates));
          },
          "capacity_tokens"_a, nb::kw_only(), "min_match"_a = d.min_match, "max_match"_a = d.max_match,
          "max_candidates"_a = d.max_candidates)
      .def(
          "add", [](GlobalSuffixIndex& g, const std::vector<int32_t>& t) { g.add(t.data(), t.size()); }, "tokens"_a,
          "Add one finished sequence, evicting the oldest sequences beyond the budget.")
      .def(
          "lookup",
          [](const GlobalSuffixIndex& g, const std::vector<int32_t>& q, int32_t max_drafts) {
            return g.lookup(q.data(), q.size(), max_drafts);
          },
          "query"_a, "max_drafts"_a, "Best earlier occurrence of the query's suffix and its continuation.")
      .def("clear", &GlobalSuffixIndex::clear)
      .def("sequences", &GlobalSuffixIndex::sequences)
      .def_prop_ro("size_tokens", &GlobalSuffixIndex::size_tokens)
      .def_prop_ro("n_sequences", &GlobalSuffixIndex::n_sequences)
      .def_prop_ro("capacity", &GlobalSuffixIndex::capacity)
      .def_prop_ro("min_match", [](const GlobalSuffixIndex& g) { return g.params().min_match; })
      .def_prop_ro("max_match", [](const GlobalSuffixIndex& g) { return g.params().max_match; });
}
