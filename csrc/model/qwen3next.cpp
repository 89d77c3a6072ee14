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

namespace {
uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
}  // namespace

std::shared_ptr<Model> Model::load(const std::string& path, const ModelOptions& opt) {
  STRATA_CHECK(opt.threads >= 0, "bad option threads=", opt.threads, ": must be >= 0 (0 = physical cores)");
  auto m = std::make_shared<Model>();
  m->file_ = GgufFile::open(path);
  m->hp_ = HParams::from_gguf(*m->file_);
  m->w_ = Weights::load(*m->file_, m->hp_);
  if (!opt.mtp_path.empty()) {
    // an MTP-only GGUF must fit this model: same shapes everywhere the block meets the trunk
    m->mtp_file_ = GgufFile::open(opt.mtp_path);
    HParams mh = HParams::from_gguf(*m->mtp_file_);
    const HParams& h = m->hp_;
    const std::string& mp = opt.mtp_path;
    if (mh.n_nextn < 1) fail<std::invalid_argument>(mp, ": no MTP block (qwen3next.nextn_predict_layers is 0 or missing)");
    auto fit = [&](const char* what, int64_t a, int64_t b) {
      if (a != b) fail<std::invalid_argument>(mp, ": MTP block does not fit ", m->file_->path(), ": ", what, " is ", a,
                                              " (the model has ", b, ")");
    };
    fit("embedding_length", mh.n_embd, h.n_embd);
    fit("block index (block_count - 1)", mh.n_layer, h.n_layer);
    fit("attention.head_count", mh.n_head, h.n_head);
    fit("attention.head_count_kv", mh.n_head_kv, h.n_head_kv);
    fit("attention.key_length", mh.head_dim, h.head_dim);
    fit("rope.dimension_count", mh.n_rot, h.n_rot);
    fit("expert_count", mh.n_expert, h.n_expert);
    fit("expert_used_count", mh.n_expert_used, h.n_expert_used);
    fit("expert_feed_forward_length", mh.n_ff_exp, h.n_ff_exp);
    fit("expert_shared_feed_forward_length", mh.n_ff_shexp, h.n_ff_shexp);
    if (const GgufTensor* te = m->mtp_file_->find("token_embd.weight"); te && te->ne.size() == 2)
      fit("vocabulary (token_embd rows)", te->ne[1], h.n_vocab);
    m->w_.mtp = MtpWeights::load(*m->mtp_file_, h);
  }
  // the default thread count adapts to a busy machine (util/threads.h); an explicit count is used as given
  m->pool_ = std::make_unique<ThreadPool>(opt.threads ? opt.threads : default_threads(), opt.threads == 0);
  // experts streamed through a bounded cache (engine spec 6); -1 keeps every expert in the mapping
  STRATA_CHECK(opt.experts.cache_mib >= -1, "bad option cache_mib=", opt.experts.cache_mib, ": expected MiB >= 0 or -1 (full)");
  STRATA_CHECK(!opt.experts.approximate || opt.experts.cache_mib != -1,
               "approximate (cache-aware) routing needs an expert cache (cache_mib); with every expert resident it is natural routing");
  if (opt.experts.cache_mib != -1) m->experts_ = std::make_unique<ExpertStream>(*m->file_, m->hp_, m->w_, opt.experts);
  uint64_t h = 1469598103934665603ull;
  const uint64_t size = m->file_->file_size();
  h = fnv1a(h, &size, sizeof size);
  for (const auto& t : m->file_->tensors()) {
    h = fnv1a(h, t.name.data(), t.name.size());
    h = fnv1a(h, &t.type, sizeof t.type);
    h = fnv1a(h, &t.offset, sizeof t.offset);
    h = fnv1a(h, t.ne.data(), t.ne.size() * sizeof(int64_t));
  }
  const std::string s = m->hp_.summary();
  m->fingerprint_ = fnv1a(h, s.data(), s.size());
  return m;
}

void forward(const Model& m, Session& s, const int32_t* tokens, int T, int64_t pos0, bool in_place, bool partial,
             bool last_only, float* logits, float* hidden) {
  const HParams& hp = m.hp();
  const Weights& W = m.weights();
  const int64_t H = hp.n_embd;
  thread_local FBuf x, h, mix;
  x.resize((size_t)T * H);    // residual stream [T][H]
  h.resize((size_t)T * H);    // normed
  mix.resize((size_t)T * H);  // block output

  const TypeTraits* et = type_traits(W.token_embd.type);
  for (int t = 0; t < T; t++)
    et->dequant(W.token_embd.data + (size_t)tokens[t] * W.token_embd.row_bytes, x.data() + (size_t)t * H, H);

  const DnMode mode = in_place ? (T > 1 && s.opt_.chunked_prefill ? DnMode::Chunked : DnMode::InPlace)
                      : partial ? DnMode::Partial : DnMode::Window;
  for (int64_t il = 0; il < hp.n_layer; il++) {
    const LayerWeights& L = W.layers[il];
    for (int t = 0; t < T; t++) rmsnorm(x.data() + t * H, L.attn_norm.data(), H, hp.rms_eps, h.data() + t * H);
    if (L.recurrent) {
      deltanet_layer(m, L.dn, s.dn_[s.layer_slot_[il]], h.data(), T, mode, mix.data());
    } else {
      attention_layer(m, L.attn, s.kv_[s.layer_slot_[il]], h.data(), T, pos0, mix.data());
    }
    for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] = x[i] + mix[i];
    for (int t = 0; t < T; t++)
      rmsnorm(x.data() + t * H, L.post_attention_norm.data(), H, hp.rms_eps, h.data() + t * H);
    moe_layer(m, L.moe, h.data(), T, mix.data());
    for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] = x[i] + mix[i];
  }

  // hidden states of every row (the MTP block drafts from them); logits of every row or only the last
  for (int t = 0; t < T; t++) rmsnorm(x.data() + t * H, W.output_norm.data(), H, hp.rms_eps, hidden + (size_t)t * H);
  const int first = last_only ? T - 1 : 0;
  matmul(m.pool(), W.output, hidden + (size_t)first * H, H, T - first, logits, hp.n_vocab);
}

}  // namespace strata
