// Anti-slop phrase penalties (engine spec 5, "slop4"): one Aho-Corasick automaton over token ids.
//
// Patterns are token sequences (every tokenization of every phrase variant, built in Python:
// python/strata_py/steering/phrases.py), each with a strength (+inf = ban). Words stay words: the automaton
// reads a symbol stream in which a virtual symbol BND (id n_vocab) stands before every token that follows
// a word boundary (the previous token's last byte is not a letter, digit, '_' or non-ASCII; also at the
// generation start and after a newline). A pattern whose first token starts with a word character begins
// with BND too, so "print" matches in "x = print" but not inside "reprint"; BND is inserted inside patterns
// by the same rule as in the stream, so the two always agree.
//
// Penalty of candidate token t at a row: over every pattern prefix that the stream + t ends with, whose
// last symbol is t, with k tokens of the pattern matched before t and L tokens in the pattern:
//   k + 1 == L (t completes the phrase)  strength (ban: t is masked to -inf)
//   k + 1 <  L (t extends a partial)     strength * k / (L - 1)   (ban: kBanRamp * k / (L - 1))
// and the largest of those values. Starting a match (k = 0) costs nothing unless it completes it.
// Phrases never cross newlines: a token containing a newline, or an end-of-generation token, resets the
// state to the start (root, at a word boundary).
//
// PhraseState is the state at one absolute position: the automaton node (the longest suffix of the stream
// since the last reset that is a pattern prefix) and the line state (whether the next token follows a word
// boundary). Rollback contract: a value, stepped by commit() over kept tokens only (processor.h).
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

// Per-token flags from the tokenizer's bytes (python/strata_py/steering/phrases.py token_flags()).
enum PhraseTokenFlag : uint8_t {
  kEndsBoundary = 1,  // the last byte is not a word character (or the token has no bytes)
  kNewline = 2,       // the token contains '\n' or '\r'
  kEog = 4,           // an end-of-generation token
  kStartsWord = 8,    // the first byte is a word character
};

struct PhraseState {
  int32_t node = 0;      // automaton node; 0 = root
  uint8_t boundary = 1;  // 1: the next token follows a word boundary (start of line, after a space, ...)
  bool operator==(const PhraseState& o) const { return node == o.node && boundary == o.boundary; }
};

class PhraseAutomaton {
 public:
  static constexpr float kBanRamp = 4.f;  // partial-match ramp of a banned phrase (its completion is -inf)
  static constexpr int64_t kDenseMin = 256;  // static penalties above this many tokens are kept dense

  // patterns[i]: token ids (none a newline or end-of-generation token); strengths[i] > 0 or +inf;
  // flags: [n_vocab] PhraseTokenFlag bits. Throws std::invalid_argument naming the bad pattern or token.
  PhraseAutomaton(const std::vector<std::vector<int32_t>>& patterns, const std::vector<float>& strengths,
                  std::vector<uint8_t> flags);

  PhraseState step(PhraseState s, int32_t token) const;
  // Sparse penalties of the row whose state is s: distinct ids, each with its penalty (+inf = ban).
  // ids/pen are cleared first. skip_static: leave out the static part (see static_penalties).
  void penalties(PhraseState s, std::vector<int32_t>& ids, std::vector<float>& pen, bool skip_static = false) const;
  // The part of every row's penalties that depends only on the line state: the root's children (single-token
  // phrases) and, after a boundary, the BND node's. With many single-token phrases it is dense: [n_vocab]
  // penalties (0 = none; the row's penalty of t is max(static[t], the sparse one)); null when sparse.
  const float* static_penalties(uint8_t boundary) const { return dense_ ? static_[boundary ? 1 : 0].data() : nullptr; }

  int64_t n_vocab() const { return (int64_t)flags_.size(); }
  int64_t n_nodes() const { return (int64_t)fail_.size(); }
  int64_t n_patterns() const { return n_patterns_; }

 private:
  int32_t child(int32_t node, int32_t sym) const;  // -1 if none
  int32_t go(int32_t node, int32_t sym) const;     // goto with failure links
  std::vector<uint8_t> flags_;
  int32_t bnd_ = 0;  // the BND symbol (= n_vocab)
  int64_t n_patterns_ = 0;
  // children in CSR form, sorted by symbol: node n's are [child_begin_[n], child_begin_[n+1])
  std::vector<int32_t> child_begin_, child_sym_, child_node_;
  std::vector<int32_t> fail_;
  // token children with a nonzero penalty (CSR), and the nearest proper failure ancestor that has any (-1: none)
  std::vector<int32_t> nz_begin_, nz_tok_;
  std::vector<float> nz_pen_;
  std::vector<int32_t> nz_link_;
  int32_t bnd_node_ = -1;  // the root's BND child (-1: none)
  bool dense_ = false;
  std::vector<float> static_[2];
};

}  // namespace strata
