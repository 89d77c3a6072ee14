// Qwen3-Next weights as views into the mapped GGUF, validated in full at load: every expected tensor
// present, shapes consistent with the hyperparameters, types supported. Small vectors (norms, gates,
// conv taps) are dequantized to float32 once.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "model/hparams.h"

namespace strata {

class GgufFile;
struct GgufTensor;

// A 3-D expert tensor ne [cols, rows, n_expert]: expert e is a rows x cols matrix.
struct ExpertMat {
  MatView all;  // rows*n_expert x cols
  int64_t rows = 0;
  MatView expert(int64_t e) const {
    MatView m = all;
    m.rows = rows;
    m.data = all.data + (size_t)e * rows * all.row_bytes;
    return m;
  }
  uint64_t file_offset = 0;  // of expert 0 in the GGUF file (for streaming)
  size_t expert_bytes() const { return (size_t)rows * all.row_bytes; }
};

struct MoeWeights {
  std::vector<float> gate_inp;  // router [n_expert, H], kept in f32 for the fp32 softmax
  ExpertMat gate_exps, up_exps, down_exps;
  MatView gate_shexp, up_shexp, down_shexp;
  std::vector<float> gate_inp_shexp;  // [H]
  bool has_shexp = false;
};

struct AttnWeights {
  MatView wq, wk, wv, wo;  // wq rows: per head [query(hd) | gate(hd)]
  std::vector<float> q_norm, k_norm;
};

struct DeltaNetWeights {
  bool legacy = false;      // fused ssm_in (raw grouped qkvz) instead of attn_qkv + attn_gate
  MatView wqkv, wgate;      // current layout
  MatView ssm_in;           // legacy layout
  MatView ssm_ba;           // rows grouped per key head: [b(r) | a(r)]
  std::vector<float> conv;   // [d_conv][conv_dim]: the GGUF's [conv_dim][d_conv] taps transposed for the conv kernel
  std::vector<float> dt_bias, ssm_a;  // [nv]
  std::vector<float> norm;  // [dv] gated norm, not zero-centred
  MatView ssm_out;
};

struct LayerWeights {
  bool recurrent = false;
  std::vector<float> attn_norm, post_attention_norm;
  AttnWeights attn;
  DeltaNetWeights dn;
  MoeWeights moe;
};

struct MtpWeights {
  bool present = false;
  MatView eh_proj;                     // [H, 2H]: input cat[enorm(emb), hnorm(h)]
  std::vector<float> enorm, hnorm, shared_head_norm;
  LayerWeights layer;                  // one gated-attention + MoE layer
  // The block stored as blk.{hp.n_layer}.* in f (the model's own file or an MTP-only GGUF).
  static MtpWeights load(const GgufFile& f, const HParams& hp);
};

struct Weights {
  MatView token_embd;
  std::vector<float> output_norm;
  MatView output;  // token_embd when output.weight is absent
  std::vector<LayerWeights> layers;
  MtpWeights mtp;

  // Reads and validates every tensor; throws std::invalid_argument naming the file and tensor.
  static Weights load(const GgufFile& f, HParams& hp);
};

}  // namespace strata
