#include "model/hparams.h"

#include <cmath>

#include "gguf/gguf.h"
#include "model/limits.h"
#include "util/common.h"

namespace strata {

int64_t HParams::n_attn_layers() const {
  int64_t n = 0;
  for (bool r : recurrent) n += r ? 0 : 1;
  return n;
}

HParams HParams::from_gguf(const GgufFile& f) {
  const std::string& path = f.path();
  const std::string arch = f.get_string("general.architecture");
  if (arch != "qwen3next")
    fail<std::invalid_argument>(path, ": architecture '", arch, "' is not supported (expected 'qwen3next')");
  auto key = [](const char* k) { return std::string("qwen3next.") + k; };
  HParams h;
  namespace L = model_limits;  // every count bounded before anything is sized from it
  h.n_embd = f.get_int_in(key("embedding_length"), 1, L::kMaxEmbd);
  const int64_t blocks = f.get_int_in(key("block_count"), 1, L::kMaxLayers);
  h.n_nextn = f.get_int_in(key("nextn_predict_layers"), 0, 1, 0);
  h.n_ctx_train = f.get_int_in(key("context_length"), 1, L::kMaxContext);
  h.n_head = f.get_int_in(key("attention.head_count"), 1, L::kMaxHeads);
  h.n_head_kv = f.get_int_in(key("attention.head_count_kv"), 1, L::kMaxHeads);
  h.head_dim = f.get_int_in(key("attention.key_length"), 1, L::kMaxHeadDim, h.n_embd / h.n_head);
  const int64_t vlen = f.get_int_in(key("attention.value_length"), 1, L::kMaxHeadDim, h.head_dim);
  h.n_rot = f.get_int_in(key("rope.dimension_count"), 0, L::kMaxHeadDim, h.head_dim / 4);
  h.rope_theta = (float)f.get_float(key("rope.freq_base"), 1e7);
  h.rms_eps = (float)f.get_float(key("attention.layer_norm_rms_epsilon"));
  h.n_expert = f.get_int_in(key("expert_count"), 1, L::kMaxExperts);
  h.n_expert_used = f.get_int_in(key("expert_used_count"), 1, L::kMaxExpertsUsed);
  h.n_ff_exp = f.get_int_in(key("expert_feed_forward_length"), 0, L::kMaxFF, 0);
  if (h.n_ff_exp == 0) h.n_ff_exp = f.get_int_in(key("feed_forward_length"), 1, L::kMaxFF * L::kMaxExpertsUsed) / h.n_expert_used;
  h.n_ff_shexp = f.get_int_in(key("expert_shared_feed_forward_length"), 0, L::kMaxFF, h.n_ff_exp);
  h.ssm_d_conv = f.get_int_in(key("ssm.conv_kernel"), 2, L::kMaxConvKernel);
  h.ssm_d_state = f.get_int_in(key("ssm.state_size"), 1, L::kMaxHeadDim);
  h.ssm_n_group = f.get_int_in(key("ssm.group_count"), 1, L::kMaxHeads);
  h.ssm_dt_rank = f.get_int_in(key("ssm.time_step_rank"), 1, L::kMaxHeads);
  h.ssm_d_inner = f.get_int_in(key("ssm.inner_size"), 1, L::kMaxFF);
  h.full_attn_interval = f.get_int_in(key("full_attention_interval"), 1, L::kMaxLayers, 4);

  auto check = [&](bool ok, const std::string& what) {
    if (!ok) fail<std::invalid_argument>(path, ": inconsistent hyperparameters: ", what);
  };
  check(blocks > h.n_nextn && h.n_nextn >= 0 && h.n_nextn <= 1,
        cat("block_count = ", blocks, " with nextn_predict_layers = ", h.n_nextn));
  h.n_layer = blocks - h.n_nextn;
  check(h.n_embd > 0, cat("embedding_length = ", h.n_embd));
  check(h.n_head > 0 && h.n_head_kv > 0 && h.n_head % h.n_head_kv == 0,
        cat("head_count = ", h.n_head, ", head_count_kv = ", h.n_head_kv, " (need a positive multiple)"));
  check(h.head_dim > 0 && vlen == h.head_dim, cat("key_length = ", h.head_dim, ", value_length = ", vlen, " (must match)"));
  check(h.n_rot > 0 && h.n_rot <= h.head_dim && h.n_rot % 2 == 0, cat("rope.dimension_count = ", h.n_rot));
  check(h.rms_eps > 0 && std::isfinite(h.rms_eps), cat("layer_norm_rms_epsilon = ", h.rms_eps));
  check(h.rope_theta > 0 && std::isfinite(h.rope_theta), cat("rope.freq_base = ", h.rope_theta));
  check(h.ssm_d_inner / h.ssm_dt_rank <= L::kMaxHeadDim,
        cat("ssm.inner_size / ssm.time_step_rank = ", h.ssm_d_inner / h.ssm_dt_rank, " (value head size above ", L::kMaxHeadDim, ")"));
  check(h.n_expert > 0 && h.n_expert_used > 0 && h.n_expert_used <= h.n_expert,
        cat("expert_count = ", h.n_expert, ", expert_used_count = ", h.n_expert_used));
  check(h.n_ff_exp > 0 && h.n_ff_shexp >= 0, cat("expert_feed_forward_length = ", h.n_ff_exp));
  check(h.ssm_d_conv >= 2, cat("ssm.conv_kernel = ", h.ssm_d_conv));
  check(h.ssm_n_group > 0 && h.ssm_dt_rank > 0 && h.ssm_dt_rank % h.ssm_n_group == 0,
        cat("ssm.group_count = ", h.ssm_n_group, ", ssm.time_step_rank = ", h.ssm_dt_rank,
            " (value heads must be a multiple of key heads)"));
  check(h.ssm_d_state > 0 && h.ssm_d_inner > 0 && h.ssm_d_inner % h.ssm_dt_rank == 0,
        cat("ssm.state_size = ", h.ssm_d_state, ", ssm.inner_size = ", h.ssm_d_inner));
  check(h.full_attn_interval >= 1, cat("full_attention_interval = ", h.full_attn_interval));

  h.recurrent.resize(h.n_layer);
  const std::string rk = key("attention.recurrent_layers");
  if (f.has_key(rk) && !f.get(rk).array.empty()) {
    const std::vector<int64_t> arr = f.get_int_array(rk);
    check((int64_t)arr.size() >= h.n_layer, cat("attention.recurrent_layers has ", arr.size(), " entries for ", h.n_layer, " layers"));
    for (int64_t i = 0; i < h.n_layer; i++) h.recurrent[i] = arr[i] != 0;
  } else {
    for (int64_t i = 0; i < h.n_layer; i++) h.recurrent[i] = ((i + 1) % h.full_attn_interval) != 0;
  }
  return h;
}

std::string HParams::summary() const {
  return cat("qwen3next: vocab ", n_vocab, ", hidden ", n_embd, ", layers ", n_layer, " (", n_dn_layers(),
             " DeltaNet + ", n_attn_layers(), " attention), heads ", n_head, "/", n_head_kv, " x ", head_dim,
             ", experts ", n_expert, " top-", n_expert_used, " ff ", n_ff_exp, ", shared ff ", n_ff_shexp,
             ", mtp layers ", n_nextn);
}

}  // namespace strata
