// Qwen3-Next, top to bottom (spec qwen3next.md 1.3):
//   x = token_embd[tokens]
//   per layer:  x = x + Mixer(rmsnorm(x; attn_norm))            Mixer = Gated DeltaNet | gated attention
//               x = x + MoE(rmsnorm(x; post_attention_norm))
//   h = rmsnorm(x; output_norm);  logits = output · h
#include <cstring>

#include "model/layers.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

void forward_qwen3next(const Model& m, LayerStates& s, const Window& win, float* logits, float* hidden) {
  const HParams& hp = m.hp();
  const Weights& W = m.weights();
  const int64_t H = hp.n_embd;
  const int T = win.T;
  const int32_t* tokens = win.tokens;
  thread_local FBuf x, h, mix;
  x.resize((size_t)T * H);    // residual stream [T][H]
  h.resize((size_t)T * H);    // normed
  mix.resize((size_t)T * H);  // block output

  const TypeTraits* et = type_traits(W.token_embd.type);
  for (int t = 0; t < T; t++)
    et->dequant(W.token_embd.data + (size_t)tokens[t] * W.token_embd.row_bytes, x.data() + (size_t)t * H, H);

  const DnMode mode = dn_mode(win);
  for (int64_t il = 0; il < hp.n_layer; il++) {
    const LayerWeights& L = W.layers[il];
    for (int t = 0; t < T; t++) rmsnorm(x.data() + t * H, L.attn_norm.data(), H, hp.rms_eps, h.data() + t * H);
    if (L.recurrent) {
      deltanet_layer(m, L.dn, s.dn[s.slot[il]], h.data(), T, mode, mix.data());
    } else {
      attention_layer(m, L.attn, s.kv[s.slot[il]], h.data(), T, win.pos0, mix.data());
    }
    for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] = x[i] + mix[i];
    for (int t = 0; t < T; t++)
      rmsnorm(x.data() + t * H, L.post_attention_norm.data(), H, hp.rms_eps, h.data() + t * H);
    moe_layer(m, L.moe, h.data(), T, mix.data());
    for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] = x[i] + mix[i];
  }

  // hidden states of every row (the MTP block drafts from them); logits of every row or only the last
  for (int t = 0; t < T; t++) rmsnorm(x.data() + t * H, W.output_norm.data(), H, hp.rms_eps, hidden + (size_t)t * H);
  const int first = win.last_only ? T - 1 : 0;
  matmul(m.pool(), W.output, hidden + (size_t)first * H, H, T - first, logits, hp.n_vocab);
}

}  // namespace strata
