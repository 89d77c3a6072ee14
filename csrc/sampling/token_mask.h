// Per-row token masks (a grammar's allowed tokens): one bit per token, bit j of word w = token 32w + j
// (llguidance's bitmask layout), 1 = allowed; a row's mask has ceil(n_vocab / 32) words.
// Each kernel has a scalar `_ref` twin that tests/test_steering.py checks it against on random rows.
#pragma once
#include <cstdint>

namespace strata {

inline int64_t mask_words(int64_t n_vocab) { return (n_vocab + 31) / 32; }

// logits[t] = -inf for every disallowed t.
void apply_token_mask(float* logits, int64_t n_vocab, const uint32_t* mask);
void apply_token_mask_ref(float* logits, int64_t n_vocab, const uint32_t* mask);

// argmax over the allowed tokens: the lowest id among the largest non-NaN allowed logits; -1 if every
// allowed logit is NaN or -inf (or none is allowed). Equals argmax() of the masked row, without writing it.
int32_t masked_argmax(const float* logits, int64_t n_vocab, const uint32_t* mask);
int32_t masked_argmax_ref(const float* logits, int64_t n_vocab, const uint32_t* mask);

// The same over x[t] - sub[t] (sub: dense penalties, +inf = banned), without writing the difference.
int32_t masked_argmax_sub(const float* x, const float* sub, int64_t n_vocab, const uint32_t* mask);
int32_t masked_argmax_sub_ref(const float* x, const float* sub, int64_t n_vocab, const uint32_t* mask);

}  // namespace strata
