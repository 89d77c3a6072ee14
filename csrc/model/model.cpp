// Model loading (every architecture) and the dispatch of a window to its architecture's graph.
#include <algorithm>

#include "gguf/gguf.h"
#include "model/backend_experts.h"
#include "model/fingerprint.h"
#include "model/layers.h"
#include "model/ple_table.h"
#include "strata.h"

namespace strata {

std::shared_ptr<Model> Model::load(const std::string& path, const ModelOptions& opt) {
  STRATA_CHECK(opt.threads >= 0, "bad option threads=", opt.threads, ": must be >= 0 (0 = physical cores)");
  auto m = std::make_shared<Model>();
  m->file_ = GgufFile::open(path);
  m->hp_ = HParams::from_gguf(*m->file_);
  if (opt.dense_attention) std::fill(m->hp_.qsa_ratio.begin(), m->hp_.qsa_ratio.end(), 0);
  m->w_ = Weights::load(*m->file_, m->hp_, opt.dense_attention);
  if (m->w_.ple_table.data) {
    STRATA_CHECK(opt.ple_map_mib >= 0, "bad option ple_map_mib=", opt.ple_map_mib, ": must be >= 0");
    m->ple_ = std::make_unique<PleTable>(*m->file_, m->w_.ple_table, m->w_.ple_table_offset,
                                         (uint64_t)opt.ple_map_mib << 20);
  }
  if (!opt.mtp_path.empty()) {
    // an MTP-only GGUF must fit this model: same shapes everywhere the block meets the trunk
    m->mtp_file_ = GgufFile::open(opt.mtp_path);
    HParams mh = HParams::from_gguf(*m->mtp_file_);
    const HParams& h = m->hp_;
    const std::string& mp = opt.mtp_path;
    if (mh.n_nextn < 1)
      fail<std::invalid_argument>(mp, ": no MTP block (", arch_name(mh.arch), ".nextn_predict_layers is 0 or missing)");
    if (mh.arch != h.arch)
      fail<std::invalid_argument>(mp, ": MTP file of architecture ", arch_name(mh.arch), " for a ", arch_name(h.arch),
                                  " model ", m->file_->path());
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
  STRATA_CHECK(!opt.experts.device || !opt.experts.approximate,
               "approximate (cache-aware) routing runs only on backend='cpu' (with a host expert cache)");
  m->expert_opt_ = opt.experts;
  if (m->streams_on_backend()) {
    BackendExperts::slots_for(*m, opt.experts.cache_mib);  // a budget below one row's experts fails here, at load
    BackendExperts::reads_file(*m, opt.experts);           // and a pinned copy larger than the machine's memory
  }
  else if (opt.experts.cache_mib != -1)
    m->experts_ = std::make_unique<ExpertStream>(*m->file_, m->hp_, m->w_, opt.experts);
  m->fingerprint_ = model_fingerprint(*m->file_, m->hp_, m->mtp_file_.get());  // model/fingerprint.h: weights too
  m->check_files();  // a truncation while the weights were read at load
  return m;
}

void Model::check_files() const {
  file_->check_intact();
  if (mtp_file_) mtp_file_->check_intact();
}

void forward(const Model& m, Session& s, const int32_t* tokens, int T, int64_t pos0, bool in_place, bool partial,
             bool last_only, float* logits, float* hidden) {
  LayerStates st{s.kv_, s.qsa_, s.dn_, s.ple_, s.layer_slot_, s.tokens_};
  const Window w{tokens, T, pos0, in_place, partial, last_only, s.opt_.chunked_prefill};
  switch (m.hp().arch) {
    case Arch::Qwen3Next: return forward_qwen3next(m, st, w, logits, hidden);
    case Arch::Qwen35Moe: return forward_qwen35moe(m, st, w, logits, hidden);
    case Arch::Qwen4Exp: return forward_qwen4exp(m, st, w, logits, hidden);
  }
}

}  // namespace strata
namespace strata { Model::~Model() = default; }
