// The multi-token-prediction block (spec qwen3next.md 1.8 / 2.6), as llama.cpp's converter lays it out in
// blk.{n_layer}: x = eh_proj · [rmsnorm(embed(t+1); enorm), rmsnorm(h_t; hnorm)]   (embedding first)
//                x = one gated-attention + MoE decoder layer (its own KV cache, unshifted positions)
//                h' = rmsnorm(x; shared_head_norm);  logits = output · h'   (the main model's head)
#include <cstring>

#include "model/layers.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

void mtp_forward(const Model& m, KvCache& kv, const float* hidden, const int32_t* next_tokens, int T, int64_t pos0,
                 float* out_hidden, float* logits_last) {
  const HParams& hp = m.hp();
  const Weights& W = m.weights();
  const MtpWeights& M = W.mtp;
  STRATA_CHECK(M.present, "this model has no MTP block");
  const int64_t H = hp.n_embd;
  thread_local FBuf cat2, x, h, mix, emb;
  cat2.resize((size_t)T * 2 * H);  // [T][enorm(emb) | hnorm(h)]
  x.resize((size_t)T * H);
  h.resize((size_t)T * H);
  mix.resize((size_t)T * H);
  emb.resize(H);
  const TypeTraits* et = type_traits(W.token_embd.type);
  for (int t = 0; t < T; t++) {
    STRATA_CHECK(next_tokens[t] >= 0 && next_tokens[t] < hp.n_vocab, "mtp: token id ", next_tokens[t], " out of range");
    et->dequant(W.token_embd.data + (size_t)next_tokens[t] * W.token_embd.row_bytes, emb.data(), H);
    rmsnorm(emb.data(), M.enorm.data(), H, hp.rms_eps, cat2.data() + (size_t)t * 2 * H);
    rmsnorm(hidden + (size_t)t * H, M.hnorm.data(), H, hp.rms_eps, cat2.data() + (size_t)t * 2 * H + H);
  }
  matmul(m.pool(), M.eh_proj, cat2.data(), 2 * H, T, x.data(), H);
  const LayerWeights& L = M.layer;
  for (int t = 0; t < T; t++) rmsnorm(x.data() + t * H, L.attn_norm.data(), H, hp.rms_eps, h.data() + t * H);
  attention_layer(m, L.attn, kv, h.data(), T, pos0, mix.data());
  for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] = x[i] + mix[i];
  for (int t = 0; t < T; t++) rmsnorm(x.data() + t * H, L.post_attention_norm.data(), H, hp.rms_eps, h.data() + t * H);
  moe_layer(m, L.moe, h.data(), T, mix.data());
  for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] = x[i] + mix[i];
  for (int t = 0; t < T; t++) rmsnorm(x.data() + t * H, M.shared_head_norm.data(), H, hp.rms_eps, out_hidden + (size_t)t * H);
  if (logits_last) matmul(m.pool(), W.output, out_hidden + (size_t)(T - 1) * H, H, 1, logits_last, hp.n_vocab);
}

}  // namespace strata
