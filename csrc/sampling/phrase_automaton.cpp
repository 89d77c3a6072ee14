// The phrase automaton (see phrase_automaton.h for the matching rule and the penalty definition).
// Build, as numbered steps:
//   1. Each pattern becomes a symbol sequence (BND before a word-starting first token and after every
//      pattern token that ends at a word boundary); the trie is built over those, each token node keeping
//      the largest penalty of a token that reaches it (complete: strength; partial: the k / (L-1) ramp).
//   2. Failure links, breadth first (a node's failure is the longest proper suffix that is a trie node).
//   3. Per node, its token children with a nonzero penalty, and the nearest failure ancestor having some.
// A row's penalties walk that chain from the row's node (after BND if the row follows a boundary): every
// suffix of the stream that is a pattern prefix is on it, so every pattern prefix ending with t is found.
#include "sampling/phrase_automaton.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "util/common.h"

namespace strata {

PhraseAutomaton::PhraseAutomaton(const std::vector<std::vector<int32_t>>& patterns, const std::vector<float>& strengths,
                                 std::vector<uint8_t> flags)
    : flags_(std::move(flags)) {
  const int64_t V = (int64_t)flags_.size();
  STRATA_CHECK(V > 0 && V < INT32_MAX, "phrase automaton: bad vocabulary size ", V);
  STRATA_CHECK(patterns.size() == strengths.size(), "phrase automaton: ", patterns.size(), " patterns but ",
               strengths.size(), " strengths");
  bnd_ = (int32_t)V;
  n_patterns_ = (int64_t)patterns.size();

  // 1. trie over symbol sequences; edges in a hash map while building
  std::unordered_map<uint64_t, int32_t> edge;
  std::vector<float> pen(1, 0.f);
  auto key = [](int32_t n, int32_t s) { return ((uint64_t)(uint32_t)n << 32) | (uint32_t)s; };
  auto walk = [&](int32_t n, int32_t s) {
    auto [it, fresh] = edge.emplace(key(n, s), (int32_t)pen.size());
    if (fresh) pen.push_back(0.f);
    return it->second;
  };
  for (size_t i = 0; i < patterns.size(); i++) {
    const auto& p = patterns[i];
    const float st = strengths[i];
    const int64_t L = (int64_t)p.size();
    STRATA_CHECK(L >= 1, "phrase automaton: pattern ", i, " is empty");
    STRATA_CHECK(st > 0.f, "phrase automaton: pattern ", i, " has strength ", st, " (must be > 0, inf = ban)");
    int32_t n = 0;
    for (int64_t k = 0; k < L; k++) {
      const int32_t t = p[k];
      STRATA_CHECK(t >= 0 && t < V, "phrase automaton: pattern ", i, " token ", t, " is outside the vocabulary [0, ", V, ")");
      STRATA_CHECK(!(flags_[t] & (kNewline | kEog)), "phrase automaton: pattern ", i, " token ", t,
                   " is a newline or end-of-generation token (phrases never cross lines)");
      const bool bnd = k == 0 ? (flags_[t] & kStartsWord) != 0 : (flags_[p[k - 1]] & kEndsBoundary) != 0;
      if (bnd) n = walk(n, bnd_);
      n = walk(n, t);
      float v;
      if (k + 1 == L) v = st;  // +inf for a ban
      else v = (std::isinf(st) ? kBanRamp : st) * (float)k / (float)(L - 1);
      pen[n] = std::max(pen[n], v);
    }
  }
  const int32_t N = (int32_t)pen.size();
  // children CSR, sorted by symbol
  std::vector<std::vector<std::pair<int32_t, int32_t>>> kids(N);
  for (const auto& [k, c] : edge) kids[(int32_t)(k >> 32)].push_back({(int32_t)(uint32_t)k, c});
  child_begin_.assign(N + 1, 0);
  for (int32_t n = 0; n < N; n++) {
    std::sort(kids[n].begin(), kids[n].end());
    child_begin_[n + 1] = child_begin_[n] + (int32_t)kids[n].size();
    for (auto& [s, c] : kids[n]) {
      child_sym_.push_back(s);
      child_node_.push_back(c);
    }
  }
  // 2. failure links, breadth first
  fail_.assign(N, 0);
  std::vector<int32_t> order{0};
  for (size_t qi = 0; qi < order.size(); qi++) {
    const int32_t u = order[qi];
    for (int32_t e = child_begin_[u]; e < child_begin_[u + 1]; e++) {
      const int32_t s = child_sym_[e], v = child_node_[e];
      if (u != 0) {
        int32_t f = fail_[u];
        while (f != 0 && child(f, s) < 0) f = fail_[f];
        const int32_t c = child(f, s);
        fail_[v] = c >= 0 ? c : 0;
      }
      order.push_back(v);
    }
  }
  // 3. nonzero token children and the chain of nodes that have some
  nz_begin_.assign(N + 1, 0);
  for (int32_t n = 0; n < N; n++) {
    for (int32_t e = child_begin_[n]; e < child_begin_[n + 1]; e++)
      if (child_sym_[e] != bnd_ && pen[child_node_[e]] > 0.f) {
        nz_tok_.push_back(child_sym_[e]);
        nz_pen_.push_back(pen[child_node_[e]]);
      }
    nz_begin_[n + 1] = (int32_t)nz_tok_.size();
  }
  nz_link_.assign(N, -1);
  for (size_t qi = 1; qi < order.size(); qi++) {  // breadth first: a node's failure is done before it
    const int32_t n = order[qi], f = fail_[n];
    nz_link_[n] = nz_begin_[f + 1] > nz_begin_[f] ? f : nz_link_[f];
  }
  // 4. the static part of a row's penalties (root, and BND node after a boundary): dense once it is large,
  //    because then one pass over the row beats thousands of scattered edits
  bnd_node_ = child(0, bnd_);
  const int64_t n_static = (nz_begin_[1] - nz_begin_[0]) +
                           (bnd_node_ >= 0 ? nz_begin_[bnd_node_ + 1] - nz_begin_[bnd_node_] : 0);
  dense_ = n_static > kDenseMin;
  if (dense_) {
    for (int b = 0; b < 2; b++) {
      static_[b].assign(V, 0.f);
      for (int32_t m : {0, b ? bnd_node_ : -1}) {
        if (m < 0) continue;
        for (int32_t e = nz_begin_[m]; e < nz_begin_[m + 1]; e++)
          static_[b][nz_tok_[e]] = std::max(static_[b][nz_tok_[e]], nz_pen_[e]);
      }
    }
  }
}

int32_t PhraseAutomaton::child(int32_t node, int32_t sym) const {
  const int32_t* b = child_sym_.data() + child_begin_[node];
  const int32_t* e = child_sym_.data() + child_begin_[node + 1];
  const int32_t* it = std::lower_bound(b, e, sym);
  return it != e && *it == sym ? child_node_[it - child_sym_.data()] : -1;
}

int32_t PhraseAutomaton::go(int32_t node, int32_t sym) const {
  for (;;) {
    const int32_t c = child(node, sym);
    if (c >= 0) return c;
    if (node == 0) return 0;
    node = fail_[node];
  }
}

PhraseState PhraseAutomaton::step(PhraseState s, int32_t token) const {
  STRATA_CHECK(token >= 0 && token < bnd_, "phrase automaton: token ", token, " is outside the vocabulary [0, ", bnd_, ")");
  const uint8_t f = flags_[token];
  if (f & (kNewline | kEog)) return PhraseState{};
  int32_t n = s.boundary ? go(s.node, bnd_) : s.node;
  n = go(n, token);
  return PhraseState{n, (uint8_t)((f & kEndsBoundary) ? 1 : 0)};
}

void PhraseAutomaton::penalties(PhraseState s, std::vector<int32_t>& ids, std::vector<float>& pen,
                                bool skip_static) const {
  ids.clear();
  pen.clear();
  // stamp[t] == gen marks t as already listed at slot[t] (no clearing of vocabulary-sized arrays per row)
  thread_local std::vector<uint32_t> stamp;
  thread_local std::vector<int32_t> slot;
  thread_local uint32_t gen = 0;
  if ((int64_t)stamp.size() < n_vocab()) {
    stamp.assign(n_vocab(), 0);
    slot.assign(n_vocab(), 0);
    gen = 0;
  }
  if (++gen == 0) {  // wrapped: start the stamps afresh
    std::fill(stamp.begin(), stamp.end(), 0);
    gen = 1;
  }
  const int32_t n0 = s.boundary ? go(s.node, bnd_) : s.node;
  for (int32_t m = nz_begin_[n0 + 1] > nz_begin_[n0] ? n0 : nz_link_[n0]; m >= 0; m = nz_link_[m]) {
    if (skip_static && (m == 0 || m == bnd_node_)) continue;  // (both are on every chain that reaches them)
    for (int32_t e = nz_begin_[m]; e < nz_begin_[m + 1]; e++) {
      const int32_t t = nz_tok_[e];
      if (stamp[t] != gen) {
        stamp[t] = gen;
        slot[t] = (int32_t)ids.size();
        ids.push_back(t);
        pen.push_back(nz_pen_[e]);
      } else {
        pen[slot[t]] = std::max(pen[slot[t]], nz_pen_[e]);
      }
    }
  }
}

}  // namespace strata
