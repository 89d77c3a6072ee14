// Weights of the three architectures as views into the mapped GGUF, validated in full at load: every
// expected tensor present, shapes consistent with the hyperparameters, types supported. Small vectors
// (norms, gates, conv taps) are dequantized to float32 once.
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

// QSA indexer of one attention layer (qwen4exp.md 1.5): q heads and one raw key head, their norms.
struct IndexerWeights {
  MatView wq;                        // [ni*di, H]
  MatView wk;                        // [di, H]
  std::vector<float> q_norm, k_norm; // [di] (+1 folded)
};

struct AttnWeights {
  MatView wq, wk, wv, wo;  // wq rows: per head [query(hd) | gate(hd)]
  std::vector<float> q_norm, k_norm;
  bool qsa = false;        // indexer present and the layer's compress ratio > 0
  IndexerWeights idx;
};

// The GGUF layouts of the DeltaNet input projections (qwen3next.md 2.2, qwen4exp.md 4.2).
enum class DnLayout {
  Legacy,   // fused ssm_in (raw grouped qkvz) + ssm_ba                            (early qwen3next files)
  Current,  // attn_qkv + attn_gate + ssm_ba, value heads grouped                   (qwen3next)
  Split,    // attn_qkv + attn_gate + ssm_beta + ssm_alpha, value heads tiled        (qwen35moe, qwen4exp)
};

struct DeltaNetWeights {
  DnLayout layout = DnLayout::Current;
  MatView wqkv, wgate;      // Current / Split
  MatView ssm_in;           // Legacy
  MatView ssm_ba;           // Legacy / Current: rows grouped per key head: [b(r) | a(r)]
  MatView ssm_beta, ssm_alpha;  // Split: [nv] rows each, in the file's (tiled) value-head order
  // Everything below is in the engine's grouped value-head order (head j = key head g * r + v), whatever
  // the file's: a Split file's per-head vectors and v conv channels are permuted at load, its projection
  // outputs at run time (deltanet.cpp). file_head[j] = the file's slot of head j.
  std::vector<int32_t> file_head;     // [nv]; empty = identity
  std::vector<float> conv;   // [d_conv][conv_dim]: the GGUF's [conv_dim][d_conv] taps transposed for the conv kernel
  std::vector<float> dt_bias, ssm_a;  // [nv]
  std::vector<float> norm;  // [dv] gated norm, not zero-centred
  bool gate_sigmoid = false;  // gated norm * sigmoid(z) instead of * silu(z)
  MatView ssm_out;
};

// One hyper-connection module (qwen4exp.md 1.3): grouped norm of the streams, low-rank mix gates,
// per-stream inject scales (absent in the head mixer).
struct HcWeights {
  std::vector<float> norm;  // [hc*H] (+1 folded)
  MatView down;             // [R, hc*H]
  MatView up;               // [hc*H, R]
  MatView inject;           // [hc, hc*H]; data == nullptr in the head mixer
};

// The PLE layer's module (qwen4exp.md 1.7); the table is Weights::ple_table.
struct PleWeights {
  bool present = false;
  MatView key;                                      // [hc*H, P]
  MatView value;                                    // [H, P]
  std::vector<float> norm_key, norm_query, norm_conv;  // [hc*H] (+1 folded)
  std::vector<float> conv;                          // [Kp][hc*H] taps (tap Kp-1 = the current row)
};

struct LayerWeights {
  bool recurrent = false;
  std::vector<float> attn_norm, post_attention_norm;  // qwen3next / qwen35moe (qwen4exp: the HC norms instead)
  AttnWeights attn;
  DeltaNetWeights dn;
  MoeWeights moe;
  HcWeights hc_attn, hc_ffn;  // qwen4exp
  PleWeights ple;             // qwen4exp, the PLE layer only
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
  std::vector<float> output_norm;  // qwen3next / qwen35moe
  HcWeights output_hc;             // qwen4exp: the head mixer in place of the final norm
  MatView output;  // token_embd when output.weight is absent
  std::vector<LayerWeights> layers;
  MtpWeights mtp;
  // qwen4exp PLE: the n-gram table per_layer_token_embd.weight [rows][dP], never read whole (ple.cpp)
  MatView ple_table;
  uint64_t ple_table_offset = 0;   // of row 0 in the file (for pread)

  // Reads and validates every tensor; throws std::invalid_argument naming the file and tensor.
  // dense_attention (benches): QSA layers run dense attention and their indexer tensors are ignored.
  static Weights load(const GgufFile& f, HParams& hp, bool dense_attention = false);
};

}  // namespace strata
