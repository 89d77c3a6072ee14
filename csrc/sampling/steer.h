// The window finish with steering (processor.h): sample_rows (sampler.h) plus, per row, logit bias,
// phrase penalties from the row's PhraseState, and the row's token mask.
#pragma once
#include <cstdint>

#include "sampling/processor.h"
#include "sampling/sampler.h"

namespace strata {

struct SteerRows {
  const Steering* steer = nullptr;      // null: masks only
  const PhraseState* states = nullptr;  // [T] each row's phrase state (after its input); null if none
  const uint32_t* masks = nullptr;      // [T][mask_words(n_vocab)] or null
  PickTrace* traces = nullptr;          // [T] or null: what each row's choice depends on (sampler.h)
  int32_t trace_cap = 0;                // at most this many candidates per trace
};

// Like sample_rows: out[i] for row i at position pos0 + i + 1, penalty history committed ++ inputs[0..i]; returns
// the rows finished (verified_prefix: as sample_rows'). `logits` is not modified. Throws std::runtime_error naming
// the position when a row's mask (with the logit bias) allows no token.
int steer_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const SteerRows& sr,
               const int32_t* committed, int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out,
               bool verified_prefix = false);

}  // namespace strata
