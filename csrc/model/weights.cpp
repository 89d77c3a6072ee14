#include "model/weights.h"

#include <cstring>

#include <algorithm>

#include "gguf/gguf.h"
#include "model/limits.h"
#include "util/common.h"

namespace strata {

namespace {

struct Loader {
  const GgufFile& f;
  const HParams& hp;
  bool dense_ok = false;  // benches: QSA layers forced dense (their indexer tensors are ignored)
  mutable uint64_t copied = 0;  // bytes of float32 copies so far (model_limits::kCopyBytesOverFile)

  // Accounts for a float32 copy of n values of tensor `name` before it is allocated.
  void copy_budget(const std::string& name, uint64_t n) const {
    const uint64_t budget = f.file_size() + model_limits::kCopyBytesOverFile;
    if (n > budget / 4 || copied + n * 4 > budget)
      fail<std::invalid_argument>(f.path(), ": tensor '", name, "': float32 copies made at load would reach ",
                                  copied + n * 4, " bytes, more than the file size plus ",
                                  model_limits::kCopyBytesOverFile >> 20, " MiB");
    copied += n * 4;
  }

  const GgufTensor* find(const std::string& name, bool required) const {
    const GgufTensor* t = f.find(name);
    if (!t && required) fail<std::invalid_argument>(f.path(), ": missing tensor '", name, "'");
    return t;
  }
  void check_shape(const GgufTensor* t, std::vector<int64_t> want) const {
    // trailing 1-dims are equivalent ([2048] == [2048, 1])
    std::vector<int64_t> got = t->ne;
    while (got.size() > want.size() && got.back() == 1) got.pop_back();
    while (want.size() > got.size() && want.back() == 1) want.pop_back();
    if (got != want) {
      GgufTensor w;
      w.ne = want;
      fail<std::invalid_argument>(f.path(), ": tensor '", t->name, "' has shape ", t->shape_str(), ", expected ",
                                  w.shape_str());
    }
  }
  void check_type(const GgufTensor* t) const {
    if (!type_supported(t->type)) {
      std::string ok;
      for (uint32_t id = 0; id < 64; id++)
        if (type_supported(id)) ok += (ok.empty() ? "" : ", ") + type_name(id);
      fail<std::invalid_argument>(f.path(), ": tensor '", t->name, "' has type ", type_name(t->type),
                                  ", which this engine does not support (supported: ", ok, ")");
    }
  }
  std::vector<float> vec(const std::string& name, int64_t n) const {
    const GgufTensor* t = find(name, true);
    check_shape(t, {n});
    check_type(t);
    copy_budget(name, (uint64_t)n);
    std::vector<float> v(n);
    type_traits(t->type)->dequant(t->data, v.data(), n);
    return v;
  }
  MatView mat(const std::string& name, int64_t cols, int64_t rows, bool required = true) const {
    const GgufTensor* t = find(name, required);
    if (!t) return MatView{};
    check_shape(t, {cols, rows});
    check_type(t);
    MatView m;
    m.data = t->data;
    m.type = t->type;
    m.rows = rows;
    m.cols = cols;
    m.row_bytes = row_bytes(t->type, cols);
    return m;
  }
  std::vector<float> mat_f32(const std::string& name, int64_t cols, int64_t rows) const {
    MatView m = mat(name, cols, rows);
    copy_budget(name, (uint64_t)rows * (uint64_t)cols);
    std::vector<float> v((size_t)rows * cols);
    for (int64_t r = 0; r < rows; r++) type_traits(m.type)->dequant(m.data + r * m.row_bytes, &v[r * cols], cols);
    return v;
  }
  ExpertMat experts(const std::string& name, int64_t cols, int64_t rows) const {
    const GgufTensor* t = find(name, true);
    check_shape(t, {cols, rows, hp.n_expert});
    check_type(t);
    ExpertMat e;
    e.all.data = t->data;
    e.all.type = t->type;
    e.all.rows = rows * hp.n_expert;
    e.all.cols = cols;
    e.all.row_bytes = row_bytes(t->type, cols);
    e.rows = rows;
    e.file_offset = f.data_offset() + t->offset;
    return e;
  }

  void load_moe(const std::string& p, MoeWeights& m) const {
    const int64_t H = hp.n_embd;
    m.gate_inp = mat_f32(p + "ffn_gate_inp.weight", H, hp.n_expert);
    m.gate_exps = experts(p + "ffn_gate_exps.weight", H, hp.n_ff_exp);
    m.up_exps = experts(p + "ffn_up_exps.weight", H, hp.n_ff_exp);
    m.down_exps = experts(p + "ffn_down_exps.weight", hp.n_ff_exp, H);
    m.has_shexp = hp.n_ff_shexp > 0 && f.find(p + "ffn_gate_shexp.weight") != nullptr;
    if (m.has_shexp) {
      m.gate_shexp = mat(p + "ffn_gate_shexp.weight", H, hp.n_ff_shexp);
      m.up_shexp = mat(p + "ffn_up_shexp.weight", H, hp.n_ff_shexp);
      m.down_shexp = mat(p + "ffn_down_shexp.weight", hp.n_ff_shexp, H);
      m.gate_inp_shexp = vec(p + "ffn_gate_inp_shexp.weight", H);
    }
  }
  void load_attn(const std::string& p, AttnWeights& a) const {
    const int64_t H = hp.n_embd, hd = hp.head_dim;
    a.wq = mat(p + "attn_q.weight", H, hp.n_head * hd * 2);
    a.wk = mat(p + "attn_k.weight", H, hp.n_head_kv * hd);
    a.wv = mat(p + "attn_v.weight", H, hp.n_head_kv * hd);
    a.wo = mat(p + "attn_output.weight", hp.n_head * hd, H);
    a.q_norm = vec(p + "attn_q_norm.weight", hd);
    a.k_norm = vec(p + "attn_k_norm.weight", hd);
  }
  void load_dn(const std::string& p, DeltaNetWeights& d) const {
    const int64_t H = hp.n_embd, nv = hp.ssm_dt_rank, nk = hp.ssm_n_group, r = nv / nk, dv = hp.dv();
    const bool has_qkv = f.find(p + "attn_qkv.weight") != nullptr;
    const bool has_in = f.find(p + "ssm_in.weight") != nullptr;
    if (hp.dn_tiled) {
      d.layout = DnLayout::Split;
      d.wqkv = mat(p + "attn_qkv.weight", H, hp.conv_dim());
      d.wgate = mat(p + "attn_gate.weight", H, hp.ssm_d_inner);
      d.ssm_beta = mat(p + "ssm_beta.weight", H, nv);
      d.ssm_alpha = mat(p + "ssm_alpha.weight", H, nv);
    } else {
      if (!has_qkv && !has_in)
        fail<std::invalid_argument>(f.path(), ": missing tensor '", p, "attn_qkv.weight' (or legacy '", p, "ssm_in.weight')");
      d.layout = has_qkv ? DnLayout::Current : DnLayout::Legacy;
      if (d.layout == DnLayout::Legacy) {
        d.ssm_in = mat(p + "ssm_in.weight", H, hp.conv_dim() + hp.ssm_d_inner);
      } else {
        d.wqkv = mat(p + "attn_qkv.weight", H, hp.conv_dim());
        d.wgate = mat(p + "attn_gate.weight", H, hp.ssm_d_inner);
      }
      d.ssm_ba = mat(p + "ssm_ba.weight", H, 2 * nv);
    }
    std::vector<float> taps = mat_f32(p + "ssm_conv1d.weight", hp.ssm_d_conv, hp.conv_dim());  // [cd][K]
    std::vector<float> dt = vec(p + "ssm_dt.bias", nv), a = vec(p + "ssm_a", nv);
    const int64_t K = hp.ssm_d_conv, cd = hp.conv_dim(), v0 = 2 * hp.key_dim();
    if (hp.dn_tiled) {
      // the file stores value head j = g * r + v (key head g) in slot v * nk + g (qwen4exp.md 4.2)
      d.file_head.resize(nv);
      for (int64_t j = 0; j < nv; j++) d.file_head[j] = (int32_t)((j % r) * nk + j / r);
      std::vector<float> t2(taps), dt2(dt), a2(a);
      for (int64_t j = 0; j < nv; j++) {
        const int64_t s = d.file_head[j];
        dt[j] = dt2[s];
        a[j] = a2[s];
        std::memcpy(&taps[(v0 + j * dv) * K], &t2[(v0 + s * dv) * K], (size_t)(dv * K) * sizeof(float));
      }
    }
    copy_budget(p + "ssm_conv1d.weight", taps.size());
    d.conv.resize(taps.size());
    for (int64_t c = 0; c < cd; c++)
      for (int64_t j = 0; j < K; j++) d.conv[j * cd + c] = taps[c * K + j];
    d.dt_bias = dt;
    d.ssm_a = a;
    d.norm = vec(p + "ssm_norm.weight", dv);
    d.gate_sigmoid = hp.dn_gate_sigmoid;
    d.ssm_out = mat(p + "ssm_out.weight", hp.ssm_d_inner, H);
  }
  void load_hc(const std::string& pre, HcWeights& c, bool inject) const {
    const int64_t W = hp.hc * hp.n_embd;
    c.norm = vec(pre + "_norm.weight", W);
    c.down = mat(pre + "_down.weight", W, hp.hc_rank);
    c.up = mat(pre + "_up.weight", hp.hc_rank, W);
    if (inject) c.inject = mat(pre + "_inject.weight", W, hp.hc);
  }
  void load_indexer(const std::string& p, AttnWeights& a, int64_t il) const {
    const bool has = f.find(p + "indexer.q_proj.weight") != nullptr;
    if (!hp.is_qsa(il)) {
      // llama.cpp's converter writes compress ratio 0 on every layer when transformers has renamed the
      // layer type (qwen4exp.md 3.3): such a file would silently run dense attention, which is not the model
      if (has && !dense_ok)
        fail<std::invalid_argument>(f.path(), ": layer ", il, " has QSA indexer tensors ('", p,
                                    "indexer.*') but qwen4exp.attention.compress_ratios[", il,
                                    "] is 0, so the layer would run dense attention, which is not the model "
                                    "(llama.cpp's converter writes 0 when transformers renamed the layer type "
                                    "'full_attention' to 'indexed_attention'); convert the checkpoint with "
                                    "`python -m strata_py.convert`");
      return;
    }
    const int64_t H = hp.n_embd, ni = hp.qsa.n_head, di = hp.qsa.head_dim;
    a.qsa = true;
    a.idx.wq = mat(p + "indexer.q_proj.weight", H, ni * di);
    a.idx.wk = mat(p + "indexer.k_proj.weight", H, di);
    a.idx.q_norm = vec(p + "indexer.q_norm.weight", di);
    a.idx.k_norm = vec(p + "indexer.k_norm.weight", di);
  }
  void load_ple(const std::string& p, PleWeights& w) const {
    const int64_t H = hp.n_embd, W = hp.hc * H, P = hp.ple.embed_dim(), Kp = hp.ple.conv_kernel;
    w.present = true;
    w.key = mat(p + "ple_key.weight", P, W);
    w.value = mat(p + "ple_value.weight", P, H);
    w.norm_key = vec(p + "ple_norm_key.weight", W);
    w.norm_query = vec(p + "ple_norm_query.weight", W);
    w.norm_conv = vec(p + "ple_norm_conv.weight", W);
    const std::vector<float> taps = mat_f32(p + "ple_conv1d.weight", Kp, W);  // [W][Kp]
    copy_budget(p + "ple_conv1d.weight", taps.size());
    w.conv.resize(taps.size());
    for (int64_t c = 0; c < W; c++)
      for (int64_t j = 0; j < Kp; j++) w.conv[j * W + c] = taps[c * Kp + j];
  }
};

}  // namespace

Weights Weights::load(const GgufFile& f, HParams& hp, bool dense_attention) {
  Loader L{f, hp, dense_attention};
  Weights w;
  const GgufTensor* emb = L.find("token_embd.weight", true);
  if (emb->ne.size() != 2 || emb->ne[0] != hp.n_embd)
    fail<std::invalid_argument>(f.path(), ": tensor 'token_embd.weight' has shape ", emb->shape_str(),
                                ", expected [", hp.n_embd, ", n_vocab]");
  hp.n_vocab = emb->ne[1];
  if (hp.n_vocab > model_limits::kMaxVocab)
    fail<std::invalid_argument>(f.path(), ": tensor 'token_embd.weight' has ", hp.n_vocab, " rows: a vocabulary above the limit of ",
                                model_limits::kMaxVocab);
  w.token_embd = L.mat("token_embd.weight", hp.n_embd, hp.n_vocab);
  const bool hc = hp.arch == Arch::Qwen4Exp;
  if (hc) L.load_hc("output_hc", w.output_hc, false);
  else w.output_norm = L.vec("output_norm.weight", hp.n_embd);
  w.output = L.mat("output.weight", hp.n_embd, hp.n_vocab, false);
  if (!w.output.data) w.output = w.token_embd;

  w.layers.resize(hp.n_layer);
  for (int64_t i = 0; i < hp.n_layer; i++) {
    const std::string p = cat("blk.", i, ".");
    LayerWeights& l = w.layers[i];
    l.recurrent = hp.recurrent[i];
    if (hc) {
      L.load_hc(p + "hc_attn", l.hc_attn, true);
      L.load_hc(p + "hc_ffn", l.hc_ffn, true);
    } else {
      l.attn_norm = L.vec(p + "attn_norm.weight", hp.n_embd);
      l.post_attention_norm = L.vec(p + "post_attention_norm.weight", hp.n_embd);
    }
    if (l.recurrent) {
      L.load_dn(p, l.dn);
    } else {
      L.load_attn(p, l.attn);
      if (hc) L.load_indexer(p, l.attn, i);
    }
    if (hc && i == hp.ple.layer) L.load_ple(p, l.ple);
    L.load_moe(p, l.moe);
  }
  if (hc && hp.ple.layer >= 0) {
    // the n-gram table: rows = sum of the head vocabularies, padded; only the rows the hash reaches are read
    const GgufTensor* t = L.find("per_layer_token_embd.weight", true);
    if (t->ne.size() != 2 || t->ne[0] != hp.ple.row_dim)
      fail<std::invalid_argument>(f.path(), ": tensor 'per_layer_token_embd.weight' has shape ", t->shape_str(),
                                  ", expected [", hp.ple.row_dim, ", rows]");
    uint64_t need = 0;
    for (int64_t h = 0; h < hp.ple.n_heads(); h++)
      need = std::max<uint64_t>(need, hp.ple.head_offsets[h] + hp.ple.head_vocab[h]);
    if ((uint64_t)t->ne[1] < need)
      fail<std::invalid_argument>(f.path(), ": tensor 'per_layer_token_embd.weight' has ", t->ne[1],
                                  " rows, but ple.head_offsets + ple.head_vocab_sizes reach row ", need);
    w.ple_table = L.mat("per_layer_token_embd.weight", hp.ple.row_dim, t->ne[1]);
    w.ple_table_offset = f.data_offset() + t->offset;
  }
  if (hp.n_nextn > 0) w.mtp = MtpWeights::load(f, hp);
  return w;
}

MtpWeights MtpWeights::load(const GgufFile& f, const HParams& hp) {
  Loader L{f, hp};
  const std::string p = cat("blk.", hp.n_layer, ".");
  MtpWeights m;
  m.present = true;
  m.eh_proj = L.mat(p + "nextn.eh_proj.weight", 2 * hp.n_embd, hp.n_embd);
  m.enorm = L.vec(p + "nextn.enorm.weight", hp.n_embd);
  m.hnorm = L.vec(p + "nextn.hnorm.weight", hp.n_embd);
  m.shared_head_norm = L.vec(p + "nextn.shared_head_norm.weight", hp.n_embd);
  m.layer.recurrent = false;
  m.layer.attn_norm = L.vec(p + "attn_norm.weight", hp.n_embd);
  m.layer.post_attention_norm = L.vec(p + "post_attention_norm.weight", hp.n_embd);
  L.load_attn(p, m.layer.attn);
  L.load_moe(p, m.layer.moe);
  return m;
}

}  // namespace strata
