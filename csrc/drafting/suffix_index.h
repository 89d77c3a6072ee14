// Suffix lookup for model-free drafting (engine spec section 4).
//
// SuffixIndex indexes one request's tokens (prompt + output) as they arrive. append() is amortised O(1):
// it hashes the last n = min_match tokens and records the position where that n-gram ends. lookup()
// takes the current suffix's n-gram, visits its most recent earlier occurrences (at most max_candidates),
// extends each match backwards (at most max_match tokens) and proposes the continuation of the best one:
//   1. longest match wins;
//   2. among equally long matches, the continuation token seen most often after them (the "frequency");
//   3. then the most recent occurrence.
// GlobalSuffixIndex holds earlier requests' outputs in a bounded token budget, oldest sequence evicted
// first (SuffixDecoding-style); a drafter consults it when the request's own index has no match.
// Neither index is model state: drafts are only proposals, verified by the model, so nothing rolls back.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace strata {

struct SuffixMatch {
  std::vector<int32_t> drafts;  // continuation of the chosen occurrence (<= max_drafts tokens)
  int32_t match_length = 0;     // tokens of the current suffix that match there (0 = no match)
  int32_t frequency = 0;        // equally long matches followed by the same next token
  int64_t position = -1;        // where the matched occurrence ends (the draft starts at position + 1)
  int64_t work = 0;             // occurrences visited + tokens compared: the lookup's cost, bounded by the caps
};

struct SuffixParams {
  int32_t min_match = 4;        // n of the n-gram key; shorter matches are not proposed
  int32_t max_match = 64;       // backward extension stops here (bounds lookup cost)
  int32_t max_candidates = 64;  // most recent occurrences of the key visited per lookup
  void validate() const;        // std::invalid_argument naming the bad field
};

class SuffixIndex {
 public:
  explicit SuffixIndex(const SuffixParams& p = {});
  void append(int32_t tok);
  void extend(const int32_t* toks, size_t n);
  SuffixMatch lookup(int32_t max_drafts) const;
  size_t size() const { return toks_.size(); }
  const std::vector<int32_t>& tokens() const { return toks_; }
  const SuffixParams& params() const { return p_; }
  void clear();

 private:
  SuffixParams p_;
  std::vector<int32_t> toks_;
  std::unordered_map<uint64_t, std::vector<int64_t>> ends_;  // n-gram hash -> end positions, ascending
};

class GlobalSuffixIndex {
 public:
  GlobalSuffixIndex(size_t capacity_tokens, const SuffixParams& p = {});
  // One finished sequence (e.g. a request's output). Evicts the oldest sequences until the total fits;
  // a sequence longer than the whole budget keeps only its last capacity_tokens tokens.
  void add(const int32_t* toks, size_t n);
  // The best earlier occurrence of the query's suffix (the query is the request's context tail).
  SuffixMatch lookup(const int32_t* query, size_t n, int32_t max_drafts) const;
  size_t size_tokens() const;
  size_t n_sequences() const;
  size_t capacity() const { return cap_; }
  const SuffixParams& params() const { return p_; }
  std::vector<std::vector<int32_t>> sequences() const;  // what is held now, oldest first (tests)
  void clear();

 private:
  struct Seq {
    int64_t start, end;  // global positions [start, end)
  };
  int32_t at(int64_t pos) const { return toks_[(size_t)(pos - base_)]; }
  const Seq& seq_of(int64_t pos) const;
  void evict_front();

  SuffixParams p_;
  size_t cap_;
  mutable std::mutex mu_;
  std::deque<int32_t> toks_;
  int64_t base_ = 0;  // global position of toks_[0]; positions are never reused
  std::deque<Seq> seqs_;
  std::unordered_map<uint64_t, std::deque<int64_t>> ends_;  // n-gram hash -> end positions, ascending
};

}  // namespace strata
