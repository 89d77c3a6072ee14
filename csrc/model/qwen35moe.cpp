// Qwen3.5/3.6-MoE (qwen4exp.md 2): Qwen3-Next's graph, layer for layer:
//   x = token_embd[tokens]
//   per layer:  x = x + Mixer(rmsnorm(x; attn_norm))            Mixer = Gated DeltaNet | gated attention
//               x = x + MoE(rmsnorm(x; post_attention_norm))
//   h = rmsnorm(x; output_norm);  logits = output · h
// What differs is below this file: the DeltaNet's four projections with tiled value heads
// (DnLayout::Split, handled in deltanet.cpp), interleaved mRoPE (for text positions all three rows are
// the token's position, so it is exactly the partial NeoX RoPE of attention.cpp), a router that always
// renormalises (as moe.cpp always does) and the MTP block of qwen3next's layout.
#include "model/layers.h"

namespace strata {

void forward_qwen35moe(const Model& m, LayerStates& s, const Window& w, float* logits, float* hidden) {
  forward_qwen3next(m, s, w, logits, hidden);
}

}  // namespace strata
