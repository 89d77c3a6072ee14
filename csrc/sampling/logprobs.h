// Log-probabilities of chosen tokens, and the most likely alternatives, from raw logits (the server's
// `logprobs` / `top_logprobs`). They are the model's own distribution, before temperature, penalties or any
// logit processor (vLLM's default), so they are the same whichever window a row was computed in.
#pragma once
#include <cstdint>

namespace strata {

// For each of `rows` rows of logits [rows][n_vocab]: lp[i] = log softmax(row i)[tokens[i]], and the top_n
// most likely ids (highest first, lowest id on ties) with their log-probabilities in top_ids / top_lp
// [rows][top_n]. NaN logits count as -inf. Sums are in double, in id order (one fixed order).
void token_logprobs(const float* logits, int64_t rows, int64_t n_vocab, const int32_t* tokens, int top_n, float* lp,
                    int32_t* top_ids, float* top_lp);

}  // namespace strata
