#include "model/hparams.h"

#include "gguf/gguf.h"
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
  h.n_embd = f.get_int(key("embedding_length"));
  const int64_t blocks = f.get_int(key("block_count"));
  h.n_nextn = f.get_int(key("nextn_predict_layers"), 0);
  h.n_ctx_train = f.get_int(key("context_length"));
  h.n_head = f.get_int(key("attention.head_count"));
  h.n_head_kv = f.get_int(key("attention.head_count_kv"));
  h.head_dim = f.get_int(key("attention.key_length"), h.n_head ? h.n_embd / h.n_head : 0);
  const int64_t vlen = f.get_int(key("attention.value_length"), h.head_dim);
  h.n_rot = f.get_int(key("rope.dimension_count"), h.head_dim / 4);
  h.rope_theta = (float)f.get_float(key("rope.freq_base"), 1e7);
  h.rms_eps = (float)f.get_float(key("attention.layer_norm_rms_epsilon"));
  h.n_expert = f.get_int(key("expert_count"));
  h.n_expert_used = f.get_int(key("expert_used_count"));
  h.n_ff_exp = f.get_int(key("expert_feed_forward_length"), 0);
  if (h.n_ff_exp == 0 && h.n_expert_used > 0) h.n_ff_exp = f.get_int(key("feed_forward_length")) / h.n_expert_used;
  h.n_ff_shexp = f.get_int(key("expert_shared_feed_forward_length"), h.n_ff_exp);
  h.ssm_d_conv = f.get_int(key("ssm.conv_kernel"));
  h.ssm_d_state = f.get_int(key("ssm.state_size"));
  h.ssm_n_group = f.get_int(key("ssm.group_count"));
  h.ssm_dt_rank = f.get_int(key("ssm.time_step_rank"));
  h.ssm_d_inner = f.get_int(key("ssm.inner_size"));
  h.full_attn_interval = f.get_int(key("full_attention_interval"), 4);

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
  check(h.rms_eps > 0, cat("layer_norm_rms_epsilon = ", h.rms_eps));
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
    const auto& arr = f.get(rk).array;
    check((int64_t)arr.size() >= h.n_layer, cat("attention.recurrent_layers has ", arr.size(), " entries for ", h.n_layer, " layers"));
    for (int64_t i = 0; i < h.n_layer; i++) {
      const auto& v = arr[i].scalar;
      bool r = false;
      if (auto b = std::get_if<bool>(&v)) r = *b;
      else if (auto s = std::get_if<int64_t>(&v)) r = *s != 0;
      else if (auto u = std::get_if<uint64_t>(&v)) r = *u != 0;
      h.recurrent[i] = r;
    }
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
