// DRY ("don't repeat yourself"), the sequence-repetition penalty of koboldcpp PR #982 / llama.cpp PR #9702,
// with llama.cpp's exact semantics (src/llama-sampler.cpp, llama_sampler_dry_apply).
//
// For a row whose history is h[0..n) (the committed tokens, the prompt included, then the window's inputs up to
// the row), over the last N = min(n, last_n) tokens (last_n < 0: all of them):
//   1. rep_limit: walking back from the newest token, the first complete sequence breaker found caps the length
//      of any repeat at the number of tokens after it (rep_limit = N when there is none). N <= allowed_length or rep_limit < allowed_length: no penalty.
//   2. For each earlier position j < N-1 of the window, len(j) = the longest k such that the k tokens ending at
//      j equal the last k tokens of the window (k <= j+1), capped at rep_limit.
//   3. A token t that follows some j with len(j) >= allowed_length would extend a repeat; its repeat length is
//      the maximum len(j) over those j.
//   4. logit[t] -= (float)(multiplier * pow(base, min(len - allowed_length, max_exp))), max_exp =
//      floor(88.7228391 / ln(base)) when base > 1.000001 (no cap otherwise), unless t is a single-token breaker.
// Breakers are given as llama.cpp processes them (python/strata_py/steering/dry.py does the tokenizer part):
// a head token (one whose bytes hold the breaker, or end with a prefix of it) and a tail (the tokens of the
// breaker's rest, at most 20, empty for the former); a breaker starts at index i counted from the newest token
// (0-based) when that token is the head and the newer tokens i-1, i-2, ... equal the tail; rep_limit is then
// i - len(tail), the tokens after the breaker.
//
// Rollback contract: none needed. The penalty of a row is a pure function of its history (committed tokens and
// the window's inputs up to the row), so a rejected row leaves nothing and a restored checkpoint (which holds
// the committed tokens) continues exactly. It is one more processor under sampling/processor.h's contract.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace strata {

struct DryPenalty {
  float multiplier = 0.f;      // 0 = off
  float base = 1.75f;          // >= 1
  int32_t allowed_length = 2;  // >= 0; repeats longer than this are penalised
  int32_t last_n = -1;         // tokens of history scanned; -1 = all, 0 = off
  std::unordered_multimap<int32_t, std::vector<int32_t>> breakers;  // head token -> tail (the tokens after it)
  std::vector<uint8_t> single_breaker;  // [n_vocab]: 1 if the token alone is a breaker (an empty tail)

  // llama.cpp's condition: multiplier != 0, base >= 1, last_n != 0.
  bool active() const { return multiplier != 0.f && base >= 1.f && last_n != 0; }

  // Builds from processed breakers: heads[i] with tails[i]. Throws std::invalid_argument naming the bad field.
  static DryPenalty make(float multiplier, float base, int32_t allowed_length, int32_t last_n,
                         const std::vector<int32_t>& heads, const std::vector<std::vector<int32_t>>& tails,
                         int64_t n_vocab);

  // The row's penalties: ids (ascending) and amounts to subtract, from the history h[0..n).
  void penalties(const int32_t* h, int64_t n, std::vector<int32_t>& ids, std::vector<float>& amounts) const;

  // The number of history tokens a row needs: the last min(n, last_n) (all when last_n < 0).
  int64_t window(int64_t n) const { return last_n < 0 ? n : (n < last_n ? n : (int64_t)last_n); }
};

// In place over one row: logit[t] -= amount for each penalised token t.
void apply_dry(float* logits, int64_t n_vocab, const DryPenalty& d, const int32_t* h, int64_t n);

}  // namespace strata
