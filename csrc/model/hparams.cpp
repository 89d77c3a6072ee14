#include "model/hparams.h"

#include <cmath>

#include "gguf/gguf.h"
#include "model/limits.h"
#include "util/common.h"

namespace strata {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Qwen3Next: return "qwen3next";
    case Arch::Qwen35Moe: return "qwen35moe";
    case Arch::Qwen4Exp: return "qwen4exp";
  }
  return "?";
}

int64_t HParams::n_attn_layers() const {
  int64_t n = 0;
  for (bool r : recurrent) n += r ? 0 : 1;
  return n;
}

namespace {

// u64 arrays exactly (the PLE hash constants are 45-bit and larger integers: never through a float).
std::vector<uint64_t> u64_array(const GgufFile& f, const std::string& key) {
  const GgufValue& v = f.get(key);
  if (v.type != GgufValueType::ARRAY)
    fail<std::invalid_argument>(f.path(), ": metadata key '", key, "' is not an array");
  std::vector<uint64_t> out;
  for (const auto& e : v.array) {
    if (auto u = std::get_if<uint64_t>(&e.scalar)) out.push_back(*u);
    else if (auto s = std::get_if<int64_t>(&e.scalar); s && *s >= 0) out.push_back((uint64_t)*s);
    else fail<std::invalid_argument>(f.path(), ": metadata key '", key, "' must hold non-negative integers");
  }
  return out;
}

}  // namespace

HParams HParams::from_gguf(const GgufFile& f) {
  const std::string& path = f.path();
  const std::string arch = f.get_string("general.architecture");
  HParams h;
  if (arch == "qwen3next") h.arch = Arch::Qwen3Next;
  else if (arch == "qwen35moe") h.arch = Arch::Qwen35Moe;
  else if (arch == "qwen4exp") h.arch = Arch::Qwen4Exp;
  else
    fail<std::invalid_argument>(path, ": architecture '", arch,
                                "' is not supported (expected 'qwen3next', 'qwen35moe' or 'qwen4exp')");
  const std::string pre = arch + ".";
  auto key = [&](const char* k) { return pre + k; };
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
  h.dn_tiled = h.arch != Arch::Qwen3Next;

  auto check = [&](bool ok, const std::string& what) {
    if (!ok) fail<std::invalid_argument>(path, ": inconsistent hyperparameters: ", what);
  };
  check(blocks > h.n_nextn && h.n_nextn >= 0 && h.n_nextn <= 1,
        cat("block_count = ", blocks, " with nextn_predict_layers = ", h.n_nextn));
  check(h.arch != Arch::Qwen4Exp || h.n_nextn == 0,
        cat(key("nextn_predict_layers"), " = ", h.n_nextn, " (qwen4exp has no MTP block in GGUF)"));
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
  check(!h.dn_tiled || h.dv() == h.dk(),
        cat("ssm.inner_size / ssm.time_step_rank = ", h.dv(), " != ssm.state_size = ", h.dk(),
            " (", arch, " stores one head size for keys and values)"));
  check(h.full_attn_interval >= 1, cat("full_attention_interval = ", h.full_attn_interval));

  h.recurrent.resize(h.n_layer);
  const std::string rk = key("attention.recurrent_layers");
  if (f.has_key(rk) && !f.get(rk).array.empty()) {
    const std::vector<int64_t> arr = f.get_int_array(rk);
    check((int64_t)arr.size() >= h.n_layer, cat("attention.recurrent_layers has ", arr.size(), " entries for ", h.n_layer, " layers"));
    for (int64_t i = 0; i < h.n_layer; i++) h.recurrent[i] = arr[i] != 0;
  } else if (h.arch == Arch::Qwen4Exp) {
    // the layout is authoritative only there: full_attention_interval is written as 4 whatever the model has
    fail<std::invalid_argument>(path, ": missing metadata key '", rk, "' (qwen4exp files give the layer layout there)");
  } else {
    for (int64_t i = 0; i < h.n_layer; i++) h.recurrent[i] = ((i + 1) % h.full_attn_interval) != 0;
  }

  if (h.arch == Arch::Qwen4Exp) {
    h.hc = f.get_int_in(key("hyper_connection.count"), 0, 64);
    h.hc_rank = f.get_int_in(key("hyper_connection.low_rank"), 0, L::kMaxEmbd);
    check(h.hc >= 2 && h.hc <= 64, cat("hyper_connection.count = ", h.hc, " (expected 2..64)"));
    check(h.hc_rank >= 1, cat("hyper_connection.low_rank = ", h.hc_rank));
    // the gated norm's gate: transformers uses output_gate_type or hidden_act, which GGUF does not store;
    // strata's converter writes it as qwen4exp.ssm.output_gate, llama.cpp always computes sigmoid
    const std::string gate = f.get_string(key("ssm.output_gate_type"), "sigmoid");
    check(gate == "sigmoid" || gate == "silu", cat("ssm.output_gate_type = '", gate, "' (expected 'sigmoid' or 'silu')"));
    h.dn_gate_sigmoid = gate == "sigmoid";

    // QSA
    h.qsa.n_head = f.get_int_in(key("attention.indexer.head_count"), 0, L::kMaxHeads);
    h.qsa.head_dim = f.get_int_in(key("attention.indexer.key_length"), 0, L::kMaxHeadDim);
    h.qsa.budget = f.get_int_in(key("attention.indexer.top_k"), 0, L::kMaxContext);
    std::vector<int64_t> ratios = f.get_int_array(key("attention.compress_ratios"));
    check((int64_t)ratios.size() >= h.n_layer,
          cat("attention.compress_ratios has ", ratios.size(), " entries for ", h.n_layer, " layers"));
    ratios.resize(h.n_layer);
    h.qsa_ratio = ratios;
    for (int64_t il = 0; il < h.n_layer; il++) {
      const int64_t r = ratios[il];
      if (r == 0) continue;
      check(!h.recurrent[il], cat("attention.compress_ratios[", il, "] = ", r, " on a DeltaNet layer"));
      check(r >= 1 && r <= 1024, cat("attention.compress_ratios[", il, "] = ", r));
      check(h.qsa.ratio == 0 || h.qsa.ratio == r,
            cat("attention.compress_ratios mixes ", h.qsa.ratio, " and ", r, " (one block length for all QSA layers)"));
      h.qsa.ratio = r;
    }
    if (h.qsa.ratio > 0) {
      check(h.qsa.n_head >= 1 && h.qsa.head_dim >= 2 && h.qsa.head_dim % 2 == 0,
            cat("attention.indexer.head_count = ", h.qsa.n_head, ", key_length = ", h.qsa.head_dim));
      check(h.n_rot <= h.qsa.head_dim,
            cat("rope.dimension_count = ", h.n_rot, " > attention.indexer.key_length = ", h.qsa.head_dim,
                " (the indexer rotates with the main attention's rotary dims)"));
      check(h.qsa.budget >= h.qsa.ratio && h.qsa.budget % h.qsa.ratio == 0,
            cat("attention.indexer.top_k = ", h.qsa.budget, " is not a positive multiple of the compress ratio ",
                h.qsa.ratio));
    }

    // PLE
    if (f.has_key(key("ple.layers"))) {
      const std::vector<int64_t> layers = f.get_int_array(key("ple.layers"));
      check(layers.size() <= 1, cat("ple.layers has ", layers.size(), " entries (strata, like llama.cpp, runs one PLE layer)"));
      if (!layers.empty()) {
        PleParams& p = h.ple;
        p.layer = layers[0];
        check(p.layer >= 0 && p.layer < h.n_layer && h.recurrent[p.layer],
              cat("ple.layers = [", p.layer, "] (must name a DeltaNet layer below ", h.n_layer, ")"));
        p.ngram = f.get_int_in(key("ple.ngram_size"), 0, 1024);
        p.heads_per_ngram = f.get_int_in(key("ple.heads_per_ngram"), 0, 1 << 20);
        p.conv_kernel = f.get_int_in(key("ple.conv_kernel"), 0, 1024);
        p.row_dim = f.get_int_in(key("embedding_length_per_layer_input"), 0, L::kMaxEmbd);
        p.eos = (int32_t)f.get_int_in(key("ple.eos_token_id"), -1, L::kMaxVocab);
        check(p.ngram >= 2 && p.ngram <= 16, cat("ple.ngram_size = ", p.ngram, " (expected 2..16)"));
        check(p.heads_per_ngram >= 1 && p.heads_per_ngram <= 1024, cat("ple.heads_per_ngram = ", p.heads_per_ngram));
        check(p.conv_kernel >= 1 && p.conv_kernel <= 64, cat("ple.conv_kernel = ", p.conv_kernel));
        check(p.row_dim >= 1, cat("embedding_length_per_layer_input = ", p.row_dim));
        check(p.eos >= 0, cat("ple.eos_token_id = ", p.eos));
        p.multipliers = u64_array(f, key("ple.layer_multipliers"));
        p.head_offsets = u64_array(f, key("ple.head_offsets"));
        p.head_vocab = u64_array(f, key("ple.head_vocab_sizes"));
        check((int64_t)p.multipliers.size() == p.ngram,
              cat("ple.layer_multipliers has ", p.multipliers.size(), " entries, ple.ngram_size is ", p.ngram));
        check((int64_t)p.head_offsets.size() == p.n_heads() && (int64_t)p.head_vocab.size() == p.n_heads(),
              cat("ple.head_offsets / head_vocab_sizes have ", p.head_offsets.size(), " / ", p.head_vocab.size(),
                  " entries for (ngram_size - 1) * heads_per_ngram = ", p.n_heads(), " heads"));
        for (int64_t i = 0; i < p.n_heads(); i++)
          check(p.head_vocab[i] >= 1, cat("ple.head_vocab_sizes[", i, "] = 0"));
      }
    }
  }
  return h;
}

std::string HParams::summary() const {
  std::string s = cat(arch_name(arch), ": vocab ", n_vocab, ", hidden ", n_embd, ", layers ", n_layer, " (", n_dn_layers(),
                      " DeltaNet + ", n_attn_layers(), " attention), heads ", n_head, "/", n_head_kv, " x ", head_dim,
                      ", experts ", n_expert, " top-", n_expert_used, " ff ", n_ff_exp, ", shared ff ", n_ff_shexp,
                      ", mtp layers ", n_nextn);
  if (arch == Arch::Qwen4Exp) {
    s += cat(", hyper-connections ", hc, " x rank ", hc_rank);
    int64_t n_qsa = 0;
    for (int64_t il = 0; il < n_layer; il++) n_qsa += is_qsa(il) ? 1 : 0;
    s += cat(", QSA on ", n_qsa, " layers");
    if (qsa.ratio > 0)
      s += cat(" (indexer ", qsa.n_head, " x ", qsa.head_dim, ", budget ", qsa.budget, " tokens in blocks of ",
               qsa.ratio, ")");
    if (ple.layer >= 0)
      s += cat(", PLE layer ", ple.layer, " (", ple.n_heads(), " heads x ", ple.row_dim, ", ", ple.ngram, "-grams)");
    s += dn_gate_sigmoid ? ", gate sigmoid" : ", gate silu";
  }
  return s;
}

}  // namespace strata
