// Qwen3-Next hyperparameters, read from the GGUF's `qwen3next.*` keys (spec qwen3next.md 2.1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

class GgufFile;

struct HParams {
  int64_t n_vocab = 0;
  int64_t n_embd = 0;          // H
  int64_t n_layer = 0;         // main decoder layers (block_count minus MTP layers)
  int64_t n_ctx_train = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;  // gated attention
  int64_t n_rot = 0;           // partial NeoX RoPE over the first n_rot dims of each head
  float rope_theta = 1e7f;
  float rms_eps = 1e-6f;
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  int64_t ssm_d_conv = 0;      // conv kernel (4)
  int64_t ssm_d_state = 0;     // dk = dv (128)
  int64_t ssm_n_group = 0;     // nk key heads (16)
  int64_t ssm_dt_rank = 0;     // nv value heads (32)
  int64_t ssm_d_inner = 0;     // nv * dv (4096)
  int64_t full_attn_interval = 4;
  int64_t n_nextn = 0;         // MTP layers stored after the main layers (0 or 1)
  std::vector<bool> recurrent; // per main layer: DeltaNet (true) or gated attention (false)

  int64_t dk() const { return ssm_d_state; }
  int64_t dv() const { return ssm_d_inner / ssm_dt_rank; }
  int64_t key_dim() const { return ssm_n_group * dk(); }
  int64_t conv_dim() const { return 2 * key_dim() + ssm_d_inner; }
  int64_t n_attn_layers() const;
  int64_t n_dn_layers() const { return n_layer - n_attn_layers(); }

  static HParams from_gguf(const GgufFile& f);
  std::string summary() const;
};

}  // namespace strata
