// The three block types of a Qwen3-Next layer, each over T rows (spec qwen3next.md 1.4-1.6).
#pragma once
#include <cstdint>

#include "model/weights.h"
#include "state/deltanet_state.h"
#include "state/kv_cache.h"

namespace strata {

class Model;

// Gated full attention: x [T][H] (normed) at positions pos0.. -> out [T][H]. Writes K/V cells pos0..pos0+T-1.
void attention_layer(const Model& m, const AttnWeights& w, KvCache& kv, const float* x, int T, int64_t pos0,
                     float* out);

// How a DeltaNet window treats committed state (see deltanet_state.h); Chunked: in place, a prompt window's
// rows in the chunked form (state/deltanet_chunked.h).
enum class DnMode { InPlace, Window, Partial, Chunked };
// Gated DeltaNet: x [T][H] (normed) -> out [T][H].
void deltanet_layer(const Model& m, const DeltaNetWeights& w, DeltaNetState& st, const float* x, int T, DnMode mode,
                    float* out);

// Sparse MoE + shared expert: x [T][H] (normed) -> out [T][H].
void moe_layer(const Model& m, const MoeWeights& w, const float* x, int T, float* out);

}  // namespace strata
