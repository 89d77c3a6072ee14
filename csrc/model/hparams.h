// Hyperparameters of the three hybrid architectures, read from the GGUF's `<arch>.*` keys:
//   qwen3next (spec qwen3next.md 2.1), qwen35moe (qwen4exp.md 4.1), qwen4exp (qwen4exp.md 3.1).
// All three share the Gated DeltaNet + gated attention + MoE trunk; qwen35moe changes the DeltaNet
// projection layout, qwen4exp adds hyper-connections, QSA sparse attention and a PLE layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

class GgufFile;

enum class Arch { Qwen3Next, Qwen35Moe, Qwen4Exp };
const char* arch_name(Arch a);

// QSA (qwen4exp.md 1.5): a token indexer scores r-token blocks of raw keys; a query attends to the top
// budget / r blocks plus its incomplete tail block (dense while it has at most budget / r complete blocks).
struct QsaParams {
  int64_t n_head = 0;    // ni indexer query heads (one key head)
  int64_t head_dim = 0;  // di
  int64_t budget = 0;    // B, in tokens (attention.indexer.top_k)
  int64_t ratio = 0;     // r, block length (every QSA layer has the same one, as in transformers)
  int64_t blocks() const { return budget / ratio; }  // kb: blocks kept once a query has more
};

// PLE (qwen4exp.md 1.7): hashed n-gram embeddings added to the streams before one layer's attention.
struct PleParams {
  int64_t layer = -1;     // the PLE layer (0-based); -1: none
  int64_t ngram = 0;      // N (context N-1 ids; conv dilation N)
  int64_t heads_per_ngram = 0;
  int64_t conv_kernel = 0;  // Kp
  int64_t row_dim = 0;    // dP (embedding_length_per_layer_input)
  int32_t eos = -1;
  std::vector<uint64_t> multipliers;   // [N]
  std::vector<uint64_t> head_offsets;  // [nH]
  std::vector<uint64_t> head_vocab;    // [nH]
  int64_t n_heads() const { return (ngram - 1) * heads_per_ngram; }  // nH
  int64_t embed_dim() const { return n_heads() * row_dim; }          // P
  int64_t history() const { return (conv_kernel - 1) * ngram; }      // rows of conv history
};

struct HParams {
  Arch arch = Arch::Qwen3Next;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;          // H
  int64_t n_layer = 0;         // main decoder layers (block_count minus MTP layers)
  int64_t n_ctx_train = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;  // gated attention
  int64_t n_rot = 0;           // partial NeoX RoPE over the first n_rot dims of each head (text mRoPE = this)
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
  std::vector<bool> recurrent; // per main layer: DeltaNet (true) or attention (false)
  // DeltaNet variants: value heads stored tiled (GGUF value head s reads key head s mod nk; qwen35moe,
  // qwen4exp) instead of grouped (s reads s / (nv/nk); qwen3next); the gated norm's gate is sigmoid
  // (qwen4exp as llama.cpp runs it, or as the file's qwen4exp.ssm.output_gate says) instead of SiLU.
  bool dn_tiled = false;
  bool dn_gate_sigmoid = false;
  // qwen4exp only
  int64_t hc = 0, hc_rank = 0;       // hyper-connection streams and low rank (0: no hyper-connections)
  QsaParams qsa;
  std::vector<int64_t> qsa_ratio;    // per main layer: r on QSA layers, 0 on dense / DeltaNet layers
  PleParams ple;

  int64_t dk() const { return ssm_d_state; }
  int64_t dv() const { return ssm_d_inner / ssm_dt_rank; }
  int64_t key_dim() const { return ssm_n_group * dk(); }
  int64_t conv_dim() const { return 2 * key_dim() + ssm_d_inner; }
  int64_t n_attn_layers() const;
  int64_t n_dn_layers() const { return n_layer - n_attn_layers(); }
  bool is_qsa(int64_t il) const { return !qsa_ratio.empty() && qsa_ratio[il] > 0; }

  static HParams from_gguf(const GgufFile& f);
  std::string summary() const;
};

}  // namespace strata
