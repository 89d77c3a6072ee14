// Logit processors and token choice (engine spec section 5).
//
// Position keying: the token chosen for absolute position p draws its uniform from uniform_at(seed, p),
// a pure function, so grouping rows into windows can never change a sampled token.
// Row semantics in a window at pos0 with inputs in[0..T-1]: output row i predicts position pos0+i+1;
// its penalty history is the committed sequence (positions 0..pos0-1) followed by in[0..i].
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 0.f;         // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = 0;               // 0 = off
  float top_p = 1.f;               // 1 = off
  float min_p = 0.f;               // 0 = off
  float repetition_penalty = 1.f;  // 1 = off; CTRL-style: logit > 0 ? logit / p : logit * p
  float presence_penalty = 0.f;    // subtracted once per distinct token in the window
  float frequency_penalty = 0.f;   // subtracted per occurrence in the window
  int32_t penalty_last_n = 64;     // the window: the last n tokens of the history (0 = none)
  uint64_t seed = 0;
  void validate() const;  // throws std::invalid_argument naming the bad field and value
  bool penalties_active() const {
    return penalty_last_n > 0 && (repetition_penalty != 1.f || presence_penalty != 0.f || frequency_penalty != 0.f);
  }
};

// Uniform double in [0, 1) for (seed, position): a counter-based 64-bit mix (splitmix64 finaliser).
double uniform_at(uint64_t seed, int64_t pos);

// In place over one row of logits: penalties from the history tail.
void apply_penalties(float* logits, int64_t n_vocab, const SamplingParams& p, const int32_t* hist, int64_t n_hist);

// Lowest id among the largest non-NaN logits; -1 if every logit is NaN or -inf.
int32_t argmax(const float* logits, int64_t n_vocab);

// What one row's choice depends on under a token mask (lazy grammar masks, python/strata_py/steering/grammar.py).
// For any mask that allows ids[0] (the first in the sampler's order: a token of the largest scaled logit; the
// argmax when greedy), the masked row has the same maximum scaled logit, so the same
// first cut (sampler.cpp step 1, a comparison with the maximum in log space), and its candidate order is the
// unmasked one restricted to the allowed tokens. Hence, in order of kind:
//   kComplete: ids are every candidate of that cut (top-k did not truncate them): the masked choice is
//              repick(trace, allowed bits of ids), computed by the same code as pick_token's.
//   kCheck:    ids are the candidates after top-k (or the greedy choice): if the mask allows all of them,
//              the masked candidates after top-k are these, so the choice is unchanged; otherwise the row
//              needs its full mask.
//   kOver:     more than `cap` candidates (ids is empty): the row needs its full mask.
// A mask that refuses ids[0] may change the maximum: the row needs its full mask, whatever the kind.
struct PickTrace {
  enum Kind : int8_t { kOver = 0, kCheck = 1, kComplete = 2 };
  Kind kind = kOver;
  std::vector<int32_t> ids;  // the candidates in the sampler's order (scaled logit descending, lower id first)
                             // or, greedy, the argmax
  std::vector<uint32_t> keys;  // their order keys (kComplete only; the scaled logit, order-reversed)
  double md = 0;             // the row's maximum scaled logit
  int64_t pos = 0;
  SamplingParams p;
};

// Pick a token from processed logits (read only): greedy if temperature == 0, else
// temperature -> top-k -> top-p -> min-p -> softmax -> inverse-CDF with uniform_at(seed, pos).
// trace (or null): records what the choice depends on (see PickTrace), at most `cap` candidates.
int32_t pick_token(const float* logits, int64_t n_vocab, const SamplingParams& p, int64_t pos, PickTrace* trace = nullptr,
                   int32_t cap = 0);

// The choice of a kComplete trace's row under a mask that allows exactly the ids[j] with allowed[j] != 0
// (allowed[0] must be set): equal to pick_token on that masked row.
int32_t repick(const PickTrace& trace, const uint8_t* allowed, int64_t n);

// The penalty history of window row `row`: the last last_n tokens of committed ++ inputs[0..row].
void row_history(const int32_t* committed, int64_t n_committed, const int32_t* inputs, int row, int32_t last_n,
                 std::vector<int32_t>& hist);

// Window finish: out[i] for each of the T rows, row i at position pos0 + i + 1 with history
// committed[0..n_committed) ++ inputs[0..i]. `logits` is not modified (rows are copied). Returns the rows finished:
// T, or with verified_prefix the rows up to the first whose token is not the next input (out[i] != inputs[i + 1]):
// the rows a speculative window keeps, each the same token as when every row is finished (a row's choice depends
// on its logits, its history and its position only), the rest unread.
int sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out, bool verified_prefix = false);

}  // namespace strata
