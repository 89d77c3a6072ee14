// Qwen3.8-Flash-Next / Qwen4-Exp (qwen4exp.md 1.2), top to bottom:
//   X = [e, e, ..., e]                        hc streams of e = token_embd[tokens]        [T][hc*H]
//   per layer:  X = X + PLE(X, ids)           the PLE layer only
//               m, a = hc_attn(X);  X_j = X_j + a_j * Mixer(m)     Mixer = Gated DeltaNet | QSA attention
//               m, a = hc_ffn(X);   X_j = X_j + a_j * MoE(m)
//   h = head_mixer(X)   (no final norm);   logits = output · h
#include <cstring>

#include "model/layers.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

void forward_qwen4exp(const Model& m, LayerStates& s, const Window& win, float* logits, float* hidden) {
  const HParams& hp = m.hp();
  const Weights& W = m.weights();
  const int64_t H = hp.n_embd, hc = hp.hc, WS = hc * H;
  const int T = win.T;
  thread_local FBuf X, e, mix, y, sc, ple;
  X.resize((size_t)T * WS);   // streams [T][hc][H]
  e.resize(H);
  mix.resize((size_t)T * H);  // block input
  y.resize((size_t)T * H);    // block output
  sc.resize((size_t)T * hc);  // inject scales [T][hc]

  const TypeTraits* et = type_traits(W.token_embd.type);
  for (int t = 0; t < T; t++) {
    et->dequant(W.token_embd.data + (size_t)win.tokens[t] * W.token_embd.row_bytes, e.data(), H);
    for (int64_t j = 0; j < hc; j++) std::memcpy(X.data() + (size_t)t * WS + j * H, e.data(), H * sizeof(float));
  }

  const DnMode mode = dn_mode(win);
  for (int64_t il = 0; il < hp.n_layer; il++) {
    const LayerWeights& L = W.layers[il];
    if (L.ple.present) {
      ple.resize((size_t)T * WS);
      ple_layer(m, L.ple, s.ple, X.data(), win.tokens, s.history, T, win.pos0, win.in_place, ple.data());
      for (int64_t i = 0; i < (int64_t)T * WS; i++) X[i] = X[i] + ple[i];
    }
    hc_mix(m, L.hc_attn, X.data(), T, mix.data(), sc.data());
    if (L.recurrent) deltanet_layer(m, L.dn, s.dn[s.slot[il]], mix.data(), T, mode, y.data());
    else if (L.attn.qsa) qsa_layer(m, L.attn, s.kv[s.slot[il]], s.qsa[s.slot[il]], mix.data(), T, win.pos0, y.data());
    else attention_layer(m, L.attn, s.kv[s.slot[il]], mix.data(), T, win.pos0, y.data());
    hc_inject(m, X.data(), y.data(), sc.data(), T);
    hc_mix(m, L.hc_ffn, X.data(), T, mix.data(), sc.data());
    moe_layer(m, L.moe, mix.data(), T, y.data());
    hc_inject(m, X.data(), y.data(), sc.data(), T);
  }

  hc_mix(m, W.output_hc, X.data(), T, hidden, nullptr);
  const int first = win.last_only ? T - 1 : 0;
  matmul(m.pool(), W.output, hidden + (size_t)first * H, H, T - first, logits, hp.n_vocab);
}

}  // namespace strata
