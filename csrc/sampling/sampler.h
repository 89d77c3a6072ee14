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

// Pick a token from processed logits (modified in place): greedy if temperature == 0, else
// temperature -> top-k -> top-p -> min-p -> softmax -> inverse-CDF with uniform_at(seed, pos).
int32_t pick_token(float* logits, int64_t n_vocab, const SamplingParams& p, int64_t pos);

// The penalty history of window row `row`: the last last_n tokens of committed ++ inputs[0..row].
void row_history(const int32_t* committed, int64_t n_committed, const int32_t* inputs, int row, int32_t last_n,
                 std::vector<int32_t>& hist);

// Window finish: out[i] for each of the T rows, row i at position pos0 + i + 1 with history
// committed[0..n_committed) ++ inputs[0..i]. `logits` is not modified (rows are copied).
void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                 int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out);

}  // namespace strata
