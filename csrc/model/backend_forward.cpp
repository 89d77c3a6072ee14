// The Qwen3-Next forward over the backend interface (backend_forward.h), top to bottom as qwen3next.cpp:
//   x = token_embd[tokens]
//   per layer:  x = x + Mixer(rmsnorm(x; attn_norm))            Mixer = Gated DeltaNet | gated attention
//               x = x + MoE(rmsnorm(x; post_attention_norm))
//   h = rmsnorm(x; output_norm);  logits = output · h
// Each layer below names the native function whose operations it issues, in that function's order.
#include "model/backend_forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/types.h"
#include "model/backend_experts.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

namespace {

constexpr int kChunk = 64;  // rows per forward pass of a prompt window with streamed experts, and of the MTP block's
                            // backlog (in place: the same values in any pieces); otherwise Backend::prompt_rows
constexpr int kMaxRecordedT = 16;   // decode steps and verify windows up to this T are recorded steps (CUDA graphs)
constexpr int64_t kCellBucket = 256;  // the smallest span of cells a recorded step's attention launches cover
constexpr size_t kMaxRecordings = 64;  // per session; past it every recording is dropped and made again

// The cells a recorded step's attention launches cover when its rows see up to n of a context of n_ctx cells:
// kCellBucket times a power of two, at most the context (its blocks past the position, read from backend memory,
// return at once). A step shape is recorded again only when its position passes such a span (5 times up to 4096
// cells) rather than every kCellBucket cells (16 times): each new recording is a run unrecorded and a recording
// (the cold steps of bench/profile_gpu_forward.py and bench_spec.py).
int64_t cell_span(int64_t n, int64_t n_ctx) {
  int64_t span = kCellBucket;
  while (span < n) span *= 2;
  return std::max(n, std::min(span, n_ctx));
}

// A buffer of backend memory; grow-only when used as scratch.
struct Buf {
  Backend* be = nullptr;
  void* p = nullptr;
  size_t bytes = 0;
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (be) be->release(p);
  }
  void alloc(Backend& b, size_t n) {
    if (be) be->release(p);
    be = &b;
    p = b.alloc(n);
    bytes = n;
  }
  // n zero bytes; in place when the buffer has that size already (a recorded step holds its address)
  void zeros(Backend& b, size_t n) {
    if (be != &b || bytes != n) alloc(b, n);
    std::vector<uint8_t> z(n, 0);
    if (n) b.upload(p, z.data(), n);
  }
  void grow(Backend& b, size_t n) {
    if (n > bytes || !be) {
      b.sync();  // nothing in flight still reads the old buffer
      alloc(b, n);
    }
  }
  float* f() const { return static_cast<float*>(p); }
  int32_t* i() const { return static_cast<int32_t*>(p); }
};

}  // namespace

// Every weight of the forward in backend memory: a MatView's data and every float vector are device pointers.
struct BackendModel {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Backend> be;
  std::mutex mu;  // sessions on other threads share the backend (its stream, lanes and scratch): one forward at a time
  bool host = false;  // the CPU backend: views point at the mapping and the loaded vectors
  std::vector<std::unique_ptr<Buf>> held;
  struct Dn {
    MatView wqkv, wgate, ssm_ba, ssm_beta, ssm_alpha, ssm_out;
    const float *conv, *dt_bias, *ssm_a, *norm;
    const int32_t* file_head = nullptr;  // Split: [nv], device
    bool gate_sigmoid = false;
  };
  struct Attn {
    MatView wq, wk, wv, wo;
    const float *q_norm, *k_norm;
  };
  struct Moe {
    MatView router, gate, up, down, gate_sh, up_sh, down_sh;
    size_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;
    const float* gate_inp_shexp = nullptr;
    bool has_shexp = false;
  };
  struct Layer {
    bool recurrent = false;
    const float *attn_norm, *post_norm;
    // how the products after each norm read its rows (Backend::rmsnorm's feeds): the mixer's input projections,
    // the routed experts' gate / up
    ActKind mixer_in = ActKind::Float, moe_in = ActKind::Float;
    Dn dn;
    Attn attn;
    Moe moe;
  };
  std::vector<Layer> layers;
  struct Mtp {  // the multi-token-prediction block (mtp.cpp), every weight resident
    bool present = false;
    MatView eh_proj;
    const float *enorm = nullptr, *hnorm = nullptr, *shared_head_norm = nullptr;
    Layer layer;
  } mtp;
  const float* output_norm = nullptr;
  MatView output;
  // the token embeddings in backend memory, for the MTP drafts chained on the backend (mtp_draft): only with an MTP
  // block and a table type the backend decodes (Backend::can_embed); data null otherwise (embedded on the host)
  MatView token_embd;
  // routed experts streamed into a bounded cache of backend memory (Model::load's cache_mib with device: true);
  // null: every expert resident (the gate / up / down views above)
  std::unique_ptr<BackendExperts> experts;
  // The last closed session of these weights, kept with its buffers and recorded steps (BackendSession's
  // destructor) for the next session with the same options: a request after the first replays the steps the
  // earlier ones recorded instead of recording them again. Last member: destroyed before the backend.
  std::unique_ptr<BackendSession::Impl> parked;

  ~BackendModel();

  MatView put(const MatView& m) {
    if (host || !m.data) return m;
    MatView d = m;
    d.data = static_cast<const uint8_t*>(put_bytes(m.data, (size_t)m.rows * m.row_bytes));
    return d;
  }
  const void* put_bytes(const void* src, size_t n) {
    held.push_back(std::make_unique<Buf>());
    held.back()->alloc(*be, n);
    be->upload(held.back()->p, src, n);
    return held.back()->p;
  }
  const float* put(const std::vector<float>& v) {
    if (host || v.empty()) return v.data();
    return static_cast<const float*>(put_bytes(v.data(), v.size() * sizeof(float)));
  }

  // One decoder layer's weights in backend memory (il: its index, for errors); stream: leave the routed experts to
  // BackendExperts.
  Layer layer(const LayerWeights& L, int64_t il, bool stream) {
    const HParams& hp = model->hp();
    Layer D;
    D.recurrent = L.recurrent;
    D.attn_norm = put(L.attn_norm);
    D.post_norm = put(L.post_attention_norm);
    if (L.recurrent) {
      const DeltaNetWeights& w = L.dn;
      if (w.layout == DnLayout::Legacy)
        fail<std::invalid_argument>("backend ", be->name(), ": ", model->file().path(), " layer ", il,
                                    " has the legacy fused ssm_in DeltaNet projection, which only the CPU forward "
                                    "runs (backend='cpu')");
      D.dn.wqkv = put(w.wqkv);
      D.dn.wgate = put(w.wgate);
      D.dn.ssm_ba = put(w.ssm_ba);
      D.dn.ssm_beta = put(w.ssm_beta);
      D.dn.ssm_alpha = put(w.ssm_alpha);
      D.dn.ssm_out = put(w.ssm_out);
      D.dn.conv = put(w.conv);
      D.dn.dt_bias = put(w.dt_bias);
      D.dn.ssm_a = put(w.ssm_a);
      D.dn.norm = put(w.norm);
      D.dn.gate_sigmoid = w.gate_sigmoid;
      if (w.layout == DnLayout::Split)
        D.dn.file_head = host ? w.file_head.data()
                              : static_cast<const int32_t*>(put_bytes(w.file_head.data(), w.file_head.size() * 4));
    } else {
      if (L.attn.qsa)
        fail<std::invalid_argument>("backend ", be->name(), ": layer ", il, " is QSA attention (qwen4exp), which only "
                                    "the CPU forward runs (backend='cpu')");
      D.attn = {put(L.attn.wq), put(L.attn.wk), put(L.attn.wv), put(L.attn.wo), put(L.attn.q_norm),
                put(L.attn.k_norm)};
    }
    const MoeWeights& mw = L.moe;
    const MatView router{reinterpret_cast<const uint8_t*>(mw.gate_inp.data()), GGML_F32, hp.n_expert, hp.n_embd,
                         (size_t)hp.n_embd * sizeof(float)};
    Moe& M = D.moe;
    D.moe_in = act_kind(mw.gate_exps.all.type);
    D.mixer_in = act_kind(L.recurrent ? L.dn.wqkv.type : L.attn.wq.type);
    M.router = put(router);
    if (!stream) {
      M.gate = put(mw.gate_exps.all);
      M.up = put(mw.up_exps.all);
      M.down = put(mw.down_exps.all);
    }
    M.gate.rows = mw.gate_exps.rows;
    M.up.rows = mw.up_exps.rows;
    M.down.rows = mw.down_exps.rows;
    M.gate_bytes = mw.gate_exps.expert_bytes();
    M.up_bytes = mw.up_exps.expert_bytes();
    M.down_bytes = mw.down_exps.expert_bytes();
    M.has_shexp = mw.has_shexp;
    if (mw.has_shexp) {
      M.gate_sh = put(mw.gate_shexp);
      M.up_sh = put(mw.up_shexp);
      M.down_sh = put(mw.down_shexp);
      M.gate_inp_shexp = put(mw.gate_inp_shexp);
    }
    return D;
  }

  BackendModel(std::shared_ptr<const Model> m, std::unique_ptr<Backend> b) : model(std::move(m)), be(std::move(b)) {
    host = be->name() == "cpu";
    const Weights& W = model->weights();
    const HParams& hp = model->hp();
    const bool stream = model->streams_on_backend();
    layers.resize((size_t)hp.n_layer);
    for (int64_t il = 0; il < hp.n_layer; il++) layers[il] = layer(W.layers[il], il, stream);
    if (W.mtp.present) {  // the MTP block: its layer's experts stay resident (they are not streamed)
      mtp.present = true;
      mtp.eh_proj = put(W.mtp.eh_proj);
      mtp.enorm = put(W.mtp.enorm);
      mtp.hnorm = put(W.mtp.hnorm);
      mtp.shared_head_norm = put(W.mtp.shared_head_norm);
      mtp.layer = layer(W.mtp.layer, hp.n_layer, false);
    }
    output_norm = put(W.output_norm);
    output = put(W.output);
    if (W.mtp.present && be->can_embed(W.token_embd.type))  // tied output: the same bytes, uploaded once
      token_embd = W.token_embd.data == W.output.data ? output : put(W.token_embd);
    if (stream) experts = std::make_unique<BackendExperts>(*be, *model, model->expert_options(), kChunk);
    be->sync();
  }
};

namespace {

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cuda") return make_cuda_backend(0);
  if (name == "cpu-backend") return make_cpu_backend(threads);
  fail<std::invalid_argument>("bad option backend='", name, "': expected 'cpu', 'cuda' or 'cpu-backend'");
}

// One BackendModel per (model, backend) while a session uses it: the weights are uploaded once.
std::mutex g_live_mu;
std::map<std::pair<const Model*, std::string>, std::weak_ptr<BackendModel>> g_live;

std::shared_ptr<BackendModel> backend_model(const std::shared_ptr<const Model>& m, const std::string& name) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  auto& slot = g_live[{m.get(), name}];
  if (auto p = slot.lock()) return p;
  auto p = std::make_shared<BackendModel>(m, make_backend(name, m->threads()));
  slot = p;
  return p;
}

}  // namespace

std::atomic<int64_t> g_replays{0};
std::atomic<int64_t> g_adopted{0};
int64_t recorded_step_replays() { return g_replays.load(); }

namespace {
// The model's live backend copies that stream experts (held: they stay alive while the caller uses them).
std::vector<std::shared_ptr<BackendModel>> streaming_backends(const Model* m) {
  std::vector<std::shared_ptr<BackendModel>> bms;
  std::lock_guard<std::mutex> lk(g_live_mu);
  for (auto& [key, w] : g_live)
    if (key.first == m)
      if (auto p = w.lock(); p && p->experts) bms.push_back(p);
  return bms;
}
}  // namespace

bool backend_expert_stats(const Model* m, ExpertStats* out, bool reset) {
  bool any = false;
  for (auto& p : streaming_backends(m)) {
    std::lock_guard<std::mutex> lk(p->mu);  // no forward is changing the counters
    if (reset) {
      p->experts->reset_stats();
    } else if (!any) {
      *out = p->experts->stats();
    }
    any = true;
  }
  return any;
}

bool backend_expert_fault(const Model* m, int kind, int count) {
  bool any = false;
  for (auto& p : streaming_backends(m))
    if (p->experts->from_file()) p->experts->inject_fault(kind, count), any = true;  // (atomics: no lock needed)
  return any;
}

bool is_backend_name(const std::string& name) { return name == "cpu" || name == "cuda" || name == "cpu-backend"; }

struct BackendSession::Impl {
  std::shared_ptr<BackendModel> bm;
  Backend* be;
  const Model* m;
  int max_window;
  int64_t n_ctx;
  int prompt = kChunk;  // rows per forward pass of a prompt window (Backend::prompt_rows; streamed experts: kChunk)
  struct DnState {
    Buf S, S_work, conv;                 // [nv][dk][dv] x 2, [K-1][cd]
    Buf conv_rows, eg_rows, beta_rows, raw_rows;  // replay inputs: [W][cd] (after conv, q k normed), [W][nv] x 2, [W][cd]
  };
  struct KvState {
    Buf k, v;  // [cells][width]
    int64_t cells = 0;
  };
  std::deque<DnState> dn;  // deque: Buf does not move
  std::deque<KvState> kv;
  KvState mtp_kv;  // the MTP block's cells: n_ctx + Session::kMtpCells (session.cpp's mtp_kv_), with opt.mtp
  std::vector<int> slot;
  Buf rope_cs, rope_sn;  // [n_ctx][n_rot / 2]
  // activations (grow-only)
  Buf x, h, mix, hid, logits;
  Buf raw, rawf, z, ba, fz, fb, fa, hist, convo, eg, beta, o, y;
  Buf qg, att, kvb;
  Buf rl, sel, wt, act, up, yg, sa, su, sh;
  Buf mtp_cat;  // the MTP block's [T][enorm(emb) | hnorm(hidden)]
  // mtp_draft's chain, fixed for the session (opt.mtp): depth j's embedding (emb) and output hidden row (hid),
  // its logits (lg, [kMtpDepths][V]) and its draft (tok); mtp_rows: the depths the last mtp_draft made
  static constexpr int kMtpDepths = 16;
  static constexpr size_t kMtpHead = 2 * kMtpDepths;  // mtp_draft's upload: [depth j: position, position + 1] ...
  Buf mtp_emb, mtp_hid, mtp_lg, mtp_tok;
  int mtp_rows = 0;
  Buf dslot;  // expert streaming: the window's slot numbers [T][k]
  std::unique_ptr<BackendExperts::Pins> held_pins;  // ... the window's pins, until the next piece was issued
  std::vector<int32_t> pending;                // ... and the prediction to prefetch then, for pending_layer
  int64_t pending_layer = -1;
  // Backends that record steps (CUDA): the step's input in one upload, [kHead int32: pos0, pos0 + 1, 0...][T][H]
  // embeddings; the ops that depend on the position read it there, so a recorded step replays at any position.
  static constexpr size_t kHead = 16;
  Buf inb;
  bool dev = false;        // the backend records steps: the position-from-memory forms of the attention ops
  int64_t n_cap = 0;       // attention launches cover row 0 seeing up to n_cap cells (dev)
  struct GraphKey {
    int T, first;
    bool in_place;
    int64_t n_cap;
    int piece = -1;  // a piece of a step with streamed experts (forward_streamed); -1: the whole step
    int mtp = 0;     // 0: a step of the model; j0 + 1: mtp_draft's depths [j0, first) after T fed rows;
                     // -1: commit's fold of `first` kept rows of a T-row window
    bool operator<(const GraphKey& o) const {
      return std::tie(T, first, in_place, n_cap, piece, mtp) < std::tie(o.T, o.first, o.in_place, o.n_cap, o.piece, o.mtp);
    }
  };
  struct Recording {
    std::vector<const void*> sig;  // every buffer the step touches: a recording is only valid for these addresses
    int id = -1;                   // backend recording, -1: none yet (seen once unrecorded)
    bool broken = false;           // recording failed: this step always runs unrecorded
  };
  std::map<GraphKey, std::vector<Recording>> recordings;
  size_t n_recordings = 0;
  int64_t cold = 0;  // steps recorded (or run unrecorded to grow a buffer) at their first sight (cold_steps)
  int last_T = 0;
  bool last_in_place = true;
  std::vector<float> emb;

  // bm->mu held by the caller
  Impl(std::shared_ptr<BackendModel> bm_, const SessionOptions& opt)
      : bm(std::move(bm_)), be(bm->be.get()), m(bm->model.get()), max_window(opt.max_window), n_ctx(opt.n_ctx) {
    dev = be->can_record();
    if (!bm->experts) prompt = std::max(1, be->prompt_rows());
    const HParams& hp = m->hp();
    slot.resize((size_t)hp.n_layer);
    for (int64_t il = 0; il < hp.n_layer; il++) {
      if (hp.recurrent[il]) {
        slot[il] = (int)dn.size();
        dn.emplace_back();
      } else {
        slot[il] = (int)kv.size();
        kv.emplace_back();
      }
    }
    mtp_kv.cells = opt.mtp && bm->mtp.present ? n_ctx + Session::kMtpCells : 0;
    init_state();
    const int64_t cd = hp.conv_dim(), nv = hp.ssm_dt_rank, W = max_window;
    for (auto& d : dn) {
      d.conv_rows.alloc(*be, (size_t)W * cd * 4);
      d.eg_rows.alloc(*be, (size_t)W * nv * 4);
      d.beta_rows.alloc(*be, (size_t)W * nv * 4);
      d.raw_rows.alloc(*be, (size_t)W * cd * 4);
    }
    if (!kv.empty() || mtp_kv.cells) {  // the angles of every position a cache holds
      const int64_t half = hp.n_rot / 2, np = std::max(n_ctx, mtp_kv.cells);
      std::vector<float> cs((size_t)np * half), sn((size_t)np * half);
      for (int64_t p = 0; p < np; p++) rope_angles(hp.n_rot, p, hp.rope_theta, &cs[p * half], &sn[p * half]);
      rope_cs.alloc(*be, cs.size() * 4);
      rope_sn.alloc(*be, sn.size() * 4);
      be->upload(rope_cs.p, cs.data(), cs.size() * 4);
      be->upload(rope_sn.p, sn.data(), sn.size() * 4);
    }
    be->sync();
  }

  // A new session's state, in place where the buffers exist (adopt: a closed session's buffers, whose addresses its
  // recordings hold): zero KV cells, DeltaNet S, S_work and conv history, MTP cells and chain.
  void init_state() {
    const HParams& hp = m->hp();
    const int64_t width = hp.n_head_kv * hp.head_dim, H = hp.n_embd;
    for (auto& k : kv) {
      k.k.zeros(*be, (size_t)n_ctx * width * 4);
      k.v.zeros(*be, (size_t)n_ctx * width * 4);
      k.cells = n_ctx;
    }
    if (mtp_kv.cells) {
      mtp_kv.k.zeros(*be, (size_t)mtp_kv.cells * width * 4);
      mtp_kv.v.zeros(*be, (size_t)mtp_kv.cells * width * 4);
      mtp_emb.zeros(*be, (size_t)kMtpDepths * H * 4);
      mtp_hid.zeros(*be, (size_t)kMtpDepths * H * 4);
      mtp_lg.zeros(*be, (size_t)kMtpDepths * hp.n_vocab * 4);
      mtp_tok.zeros(*be, (size_t)kMtpDepths * 4);
    }
    const int64_t nv = hp.ssm_dt_rank, cd = hp.conv_dim(), K = hp.ssm_d_conv;
    for (auto& d : dn) {
      d.S.zeros(*be, (size_t)nv * hp.dk() * hp.dv() * 4);
      d.S_work.zeros(*be, d.S.bytes);
      d.conv.zeros(*be, (size_t)std::max<int64_t>(K - 1, 1) * cd * 4);
    }
    last_T = 0;
    last_in_place = true;
    mtp_rows = 0;
    cold = 0;
  }

  // Whether a closed session's buffers (and recordings) serve a new session with these options (a parked session's
  // bm is null: mtp_present is its BackendModel's). A session without MTP runs on buffers with MTP cells too (its
  // steps never touch them, its checkpoints hold none), so requests with and without MTP drafts share them.
  bool fits(const SessionOptions& opt, bool mtp_present) const {
    return n_ctx == opt.n_ctx && max_window == opt.max_window && (mtp_kv.cells != 0 || !(opt.mtp && mtp_present));
  }
  // A session closes: nothing stays pinned or pending; the recordings stay (bm->parked, BackendSession's destructor).
  void park() {
    held_pins.reset();
    pending_layer = -1;
    bm.reset();
  }

  // bm->mu held by the caller; a parked session (bm null) is destroyed under the lock of whoever drops it, or with
  // its BackendModel (before the backend: BackendModel::parked is its last member)
  ~Impl() { drop_recordings(); }

  void reset() {
    for (auto& d : dn) {
      d.S.zeros(*be, d.S.bytes);
      d.conv.zeros(*be, d.conv.bytes);
    }
    last_T = 0;
    last_in_place = true;
  }

  // BackendSession::save_state / load_state: the state buffers hold the CPU session's layouts already (KV
  // [cells][width], S [nv][dk][dv] in the grouped head order, conv [K-1][cd] oldest first), so they copy whole.
  size_t conv_floats() const {
    const HParams& hp = m->hp();
    return (size_t)(hp.ssm_d_conv - 1) * hp.conv_dim();
  }
  void save_state(int64_t pos, int64_t mtp_pos, Checkpoint& cp) {
    STRATA_CHECK(last_T == 0 || last_in_place, "checkpoint: a verify window is pending on the backend");
    const int64_t width = m->hp().n_head_kv * m->hp().head_dim;
    be->sync();
    for (auto& c : kv) {
      cp.k.emplace_back((size_t)pos * width);
      cp.v.emplace_back((size_t)pos * width);
      be->download(cp.k.back().data(), c.k.p, (size_t)pos * width * 4);
      be->download(cp.v.back().data(), c.v.p, (size_t)pos * width * 4);
    }
    for (auto& d : dn) {
      cp.S.emplace_back(d.S.bytes / 4);
      cp.conv.emplace_back(conv_floats());
      be->download(cp.S.back().data(), d.S.p, d.S.bytes);
      be->download(cp.conv.back().data(), d.conv.p, conv_floats() * 4);
    }
    if (mtp_kv.cells) {
      cp.mtp_k.resize((size_t)mtp_pos * width);
      cp.mtp_v.resize((size_t)mtp_pos * width);
      be->download(cp.mtp_k.data(), mtp_kv.k.p, cp.mtp_k.size() * 4);
      be->download(cp.mtp_v.data(), mtp_kv.v.p, cp.mtp_v.size() * 4);
    }
  }
  void load_state(const Checkpoint& cp, bool mtp) {
    STRATA_CHECK(cp.k.size() == kv.size() && cp.S.size() == dn.size(), "restore(): checkpoint layout does not match");
    for (size_t i = 0; i < kv.size(); i++) {
      STRATA_CHECK(cp.k[i].size() * 4 <= kv[i].k.bytes && cp.v[i].size() == cp.k[i].size(),
                   "restore(): checkpoint KV size mismatch in attention layer ", i);
      be->upload(kv[i].k.p, cp.k[i].data(), cp.k[i].size() * 4);
      be->upload(kv[i].v.p, cp.v[i].data(), cp.v[i].size() * 4);
    }
    for (size_t i = 0; i < dn.size(); i++) {
      STRATA_CHECK(cp.S[i].size() * 4 == dn[i].S.bytes && cp.conv[i].size() == conv_floats(),
                   "restore(): checkpoint DeltaNet size mismatch in layer ", i);
      be->upload(dn[i].S.p, cp.S[i].data(), dn[i].S.bytes);
      be->upload(dn[i].conv.p, cp.conv[i].data(), conv_floats() * 4);
    }
    if (mtp_kv.cells) {  // zeroed in place (the recordings hold these addresses), then cells [0, mtp_pos)
      const size_t n = mtp ? cp.mtp_k.size() * 4 : 0;
      STRATA_CHECK(n <= mtp_kv.k.bytes && (!mtp || cp.mtp_v.size() == cp.mtp_k.size()),
                   "restore(): checkpoint MTP cells do not fit");
      mtp_zero(0, mtp_kv.cells);
      if (n) {
        be->upload(mtp_kv.k.p, cp.mtp_k.data(), n);
        be->upload(mtp_kv.v.p, cp.mtp_v.data(), n);
      }
    }
    last_T = 0;
    last_in_place = true;
  }

  // deltanet.cpp deltanet_layer: projections, conv + SiLU, gates, the recurrence, gated norm, ssm_out.
  void deltanet(const BackendModel::Dn& w, DnState& st, const float* xin, int T, bool in_place, float* out) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, nk = hp.ssm_n_group, nv = hp.ssm_dt_rank, dk = hp.dk(), dv = hp.dv();
    const int64_t key_dim = nk * dk, d_inner = nv * dv, cd = hp.conv_dim(), K = hp.ssm_d_conv;
    raw.grow(*be, (size_t)T * cd * 4);
    z.grow(*be, (size_t)T * d_inner * 4);
    ba.grow(*be, (size_t)T * 2 * nv * 4);
    hist.grow(*be, (size_t)(K - 1 + T) * cd * 4);
    convo.grow(*be, (size_t)T * cd * 4);
    eg.grow(*be, (size_t)T * nv * 4);
    beta.grow(*be, (size_t)T * nv * 4);
    o.grow(*be, (size_t)T * d_inner * 4);
    y.grow(*be, (size_t)T * d_inner * 4);
    if (w.file_head) {
      // the file's value heads are tiled (slot file_head[j] holds head j): brought to the grouped order
      rawf.grow(*be, (size_t)T * cd * 4);
      fz.grow(*be, (size_t)T * d_inner * 4);
      fb.grow(*be, (size_t)T * nv * 4);
      fa.grow(*be, (size_t)T * nv * 4);
      be->fork(4);  // the four projections side by side
      be->lane(0);
      be->matmul(w.wqkv, xin, H, T, rawf.f(), cd);
      be->lane(1);
      be->matmul(w.wgate, xin, H, T, fz.f(), d_inner);
      be->lane(2);
      be->matmul(w.ssm_beta, xin, H, T, fb.f(), nv);
      be->lane(3);
      be->matmul(w.ssm_alpha, xin, H, T, fa.f(), nv);
      be->join();
      be->dn_untile(rawf.f(), raw.f(), cd, key_dim, fz.f(), z.f(), fb.f(), fa.f(), ba.f(), w.file_head, T, nk, nv, dv);
    } else {
      be->fork(3);
      be->lane(0);
      be->matmul(w.wqkv, xin, H, T, raw.f(), cd);
      be->lane(1);
      be->matmul(w.wgate, xin, H, T, z.f(), d_inner);
      be->lane(2);
      be->matmul(w.ssm_ba, xin, H, T, ba.f(), 2 * nv);
      be->join();
    }
    // causal conv over [committed history ++ this window's raw rows], the gates, and the conv state (in place) or
    // the fold's replay inputs
    be->dn_conv_gates({raw.f(), st.conv.f(), hist.f(), w.conv, T, cd, (int)K, ba.f(), w.ssm_a, w.dt_bias, nk, nv, dk,
                       convo.f(), eg.f(), beta.f(), in_place, st.conv_rows.f(), st.eg_rows.f(), st.beta_rows.f(),
                       st.raw_rows.f()});
    const DnHeads a{convo.f() + key_dim, cd, convo.f() + 2 * key_dim, cd, convo.f(), cd, eg.f(), beta.f(), o.f(),
                    d_inner, nk, nv, dk, dv};
    be->dn_heads(st.S.f(), st.S_work.f(), a, T, in_place ? T : 0);
    // (quantized in the norm's kernel for ssm_out where y is its input as it stands)
    be->gated_norm_rows(o.f(), w.norm, z.f(), dv, (int)nv, T, hp.rms_eps, w.gate_sigmoid, y.f(),
                        w.file_head ? ActKind::Float : act_kind(w.ssm_out.type));
    if (w.file_head) {  // back to the file's value-head order for ssm_out's columns
      be->dn_retile(y.f(), fz.f(), w.file_head, T, nv, dv);
      be->matmul(w.ssm_out, fz.f(), d_inner, T, out, H);
      return;
    }
    be->matmul(w.ssm_out, y.f(), d_inner, T, out, H);
  }

  // attention.cpp attention_layer: q/gate, k, v (k, v straight into this window's cells), norms + RoPE, attend per
  // KV head over all T rows, the output gate, attn_output.
  // pos_dev (backends that record steps): the position's [pos0, pos0 + 1] in backend memory (default: inb's head).
  void attention(const BackendModel::Attn& w, KvState& st, const float* xin, int T, int64_t pos0, float* out,
                 const int32_t* pos_dev = nullptr) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, group = nh / nkv;
    const int64_t width = nkv * hd;
    STRATA_CHECK(pos0 + T <= st.cells, "attention: positions ", pos0, "..", pos0 + T - 1, " exceed the cache's ",
                 st.cells, " cells");
    qg.grow(*be, (size_t)T * nh * hd * 2 * 4);
    att.grow(*be, (size_t)T * nh * hd * 4);
    if (dev) return attention_at(w, st, xin, T, out, pos_dev ? pos_dev : inb.i());
    float* kc = st.k.f() + pos0 * width;
    float* vc = st.v.f() + pos0 * width;
    be->fork(3);
    be->lane(0);
    be->matmul(w.wq, xin, H, T, qg.f(), nh * hd * 2);
    be->norm_rope(qg.f(), nh * hd * 2, 2 * hd, T, (int)nh, w.q_norm, hd, hp.rms_eps, rope_cs.f(), rope_sn.f(), hp.n_rot,
                  pos0);
    be->lane(1);
    be->matmul(w.wk, xin, H, T, kc, width);
    be->norm_rope(kc, width, hd, T, (int)nkv, w.k_norm, hd, hp.rms_eps, rope_cs.f(), rope_sn.f(), hp.n_rot, pos0);
    be->lane(2);
    be->matmul(w.wv, xin, H, T, vc, width);
    be->join();
    const float scale = 1.f / std::sqrt((float)hd);
    for (int64_t g = 0; g < nkv; g++) {
      const AttendArgs args{qg.f() + g * group * hd * 2, nh * hd * 2, 2 * hd, T, (int)group, st.k.f() + g * hd,
                            st.v.f() + g * hd, width, pos0 + 1, hd, scale, att.f() + g * group * hd, nh * hd, hd};
      be->attend(args);
    }
    be->mul_sigmoid_rows(att.f(), hd, qg.f() + hd, 2 * hd, hd, T * (int)nh);
    be->matmul(w.wo, att.f(), nh * hd, T, out, H);
  }

  // attention() with the position read from backend memory (pos: [pos0, pos0 + 1]; backends that record steps): k
  // and v through kvb into the cache, the launches sized for n_cap cells.
  void attention_at(const BackendModel::Attn& w, KvState& st, const float* xin, int T, float* out, const int32_t* pos) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, group = nh / nkv;
    const int64_t width = nkv * hd;
    qg.grow(*be, (size_t)T * nh * hd * 2 * 4);
    att.grow(*be, (size_t)T * nh * hd * 4);
    kvb.grow(*be, (size_t)2 * T * width * 4);
    float* kr = kvb.f();
    float* vr = kvb.f() + (size_t)T * width;
    be->fork(3);
    be->lane(0);
    be->matmul(w.wq, xin, H, T, qg.f(), nh * hd * 2);
    be->norm_rope_at(qg.f(), nh * hd * 2, 2 * hd, T, (int)nh, w.q_norm, hd, hp.rms_eps, rope_cs.f(), rope_sn.f(),
                     hp.n_rot, pos);
    be->lane(1);
    be->matmul(w.wk, xin, H, T, kr, width);
    be->norm_rope_at(kr, width, hd, T, (int)nkv, w.k_norm, hd, hp.rms_eps, rope_cs.f(), rope_sn.f(), hp.n_rot, pos);
    be->lane(2);
    be->matmul(w.wv, xin, H, T, vr, width);
    be->join();
    be->kv_store(kr, vr, T, width, st.k.f(), st.v.f(), pos);
    const float scale = 1.f / std::sqrt((float)hd);
    for (int64_t g = 0; g < nkv; g++) {
      const AttendArgs args{qg.f() + g * group * hd * 2, nh * hd * 2, 2 * hd, T, (int)group, st.k.f() + g * hd,
                            st.v.f() + g * hd, width, n_cap, hd, scale, att.f() + g * group * hd, nh * hd, hd};
      be->attend_at(args, pos + 1);
    }
    be->mul_sigmoid_rows(att.f(), hd, qg.f() + hd, 2 * hd, hd, T * (int)nh);
    be->matmul(w.wo, att.f(), nh * hd, T, out, H);
  }

  // The shared expert over every row of xin on lane 1 of an open fork of 3, its gate on lane 2 beside it
  // (moe_shared_gate: one running sum a row, as long as the expert's products); returns its output rows (sh).
  const float* shared_expert(const BackendModel::Moe& w, const float* xin, int T) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, Fs = hp.n_ff_shexp;
    be->lane(2);
    be->moe_shared_gate(w.gate_inp_shexp, xin, T, H);
    be->lane(1);
    be->matmul(w.gate_sh, xin, H, T, sa.f(), Fs);
    be->matmul(w.up_sh, xin, H, T, su.f(), Fs);
    be->silu_mul(sa.f(), su.f(), T * Fs);
    be->matmul(w.down_sh, sa.f(), Fs, T, sh.f(), H);
    return sh.f();
  }

  // moe.cpp moe_layer: router, routing, each row's k experts (gate, up, SwiGLU, down) over the device selection,
  // the shared expert over all rows, the combine.
  void moe(const BackendModel::Moe& w, const float* xin, int T, float* out) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, E = hp.n_expert, k = hp.n_expert_used, F = hp.n_ff_exp, S = (int64_t)T * k;
    rl.grow(*be, (size_t)T * E * 4);
    sel.grow(*be, (size_t)S * 4);
    wt.grow(*be, (size_t)S * 4);
    act.grow(*be, (size_t)S * F * 4);
    up.grow(*be, (size_t)S * F * 4);
    yg.grow(*be, (size_t)S * H * 4);
    const int64_t Fs = hp.n_ff_shexp;
    if (w.has_shexp) {
      sa.grow(*be, (size_t)T * Fs * 4);
      su.grow(*be, (size_t)T * Fs * 4);
      sh.grow(*be, (size_t)T * H * 4);
    }
    // lane 0: routing and the routed experts; lane 1: the shared expert (over every row); lane 2: its gate
    be->fork(w.has_shexp ? 3 : 1);
    be->lane(0);
    be->matmul(w.router, xin, H, T, rl.f(), E);
    be->moe_route(rl.f(), T, E, (int)k, sel.i(), wt.f());
    be->matmul_sel_swiglu(w.gate, w.gate_bytes, w.up, w.up_bytes, sel.i(), (int)S, (int)k, xin, H, act.f(), up.f());
    be->matmul_sel(w.down, w.down_bytes, sel.i(), (int)S, 1, act.f(), F, yg.f(), H);
    const float* shp = nullptr;
    if (w.has_shexp) shp = shared_expert(w, xin, T);
    be->join();
    be->moe_combine(yg.f(), wt.f(), T, (int)k, H, shp, w.gate_inp_shexp, xin, out);
  }

  // moe() with the routed experts streamed (backend_experts.h), in three parts with the host acting between them:
  //   route_part   the router and routing (and layer+1's router on the same rows: its predicted experts), the
  //                selection downloaded into pinned host memory
  //   host_part    waits for it; pins the union's slots, copies the missing experts and the slot numbers (fenced),
  //                prefetches layer+1's predicted experts; a union larger than the cache runs the routed products
  //                here, in groups of rows (returns true: done)
  //   expert_part  the routed products over slot numbers (unless done), the shared expert beside them, the combine
  // The same values as moe(). On a backend that records steps, the parts between host parts are recorded pieces
  // (forward_streamed).
  void route_part(const BackendModel::Moe& w, int64_t il, const float* xin, int T) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, E = hp.n_expert, k = hp.n_expert_used, S = (int64_t)T * k;
    const bool predict = bm->experts->prefetch_on() && il + 1 < hp.n_layer;
    const int np = predict ? 2 : 1;
    STRATA_CHECK(T <= kChunk, "moe: ", T, " rows exceed a piece of ", kChunk);
    be->matmul(w.router, xin, H, T, rl.f(), E);
    be->moe_route(rl.f(), T, E, (int)k, sel.i(), wt.f());
    if (predict) {  // layer+1's router on these rows: its likely experts
      be->matmul(bm->layers[il + 1].moe.router, xin, H, T, rl.f() + (size_t)T * E, E);
      be->moe_route(rl.f() + (size_t)T * E, T, E, (int)k, sel.i() + S, wt.f() + S);
    }
    be->download_async(bm->experts->selection_buffer(), sel.p, (size_t)np * S * 4);
  }

  bool host_part(int64_t il, const float* xin, int T) {
    const HParams& hp = m->hp();
    BackendExperts& X = *bm->experts;
    const int64_t H = hp.n_embd, k = hp.n_expert_used, F = hp.n_ff_exp, S = (int64_t)T * k;
    const bool predict = X.prefetch_on() && il + 1 < hp.n_layer;
    be->sync();  // the selection is on the host, and no kernel reads a slot now
    const int32_t* sel_host = X.selection_buffer();  // [T][k], then layer+1's predicted [T][k]
    X.note_window(il, sel_host, (int)S);
    if (X.group_end(sel_host, 0, T, (int)k) == T) {  // one group: the products run in expert_part
      held_pins = std::make_unique<BackendExperts::Pins>(X, il, sel_host, 0, (int)S, dslot.i());
      // the prediction is prefetched once the next piece is on its way (after_launch), while these pins hold
      if (predict) pending.assign(sel_host + S, sel_host + 2 * S), pending_layer = il + 1;
      return false;
    }
    int groups = 0;
    for (int r0 = 0; r0 < T; groups++) {
      const int r1 = X.group_end(sel_host, r0, T, (int)k);
      if (r0 > 0) be->sync();  // the previous group's products read slots this group may take
      const int off = r0 * (int)k, n = (r1 - r0) * (int)k;
      BackendExperts::Pins pins(X, il, sel_host, off, n, dslot.i());
      routed_products(il, xin, r0, r1 - r0);
      if (predict && r1 == T) X.prefetch(il + 1, sel_host + S, (int)S);
      r0 = r1;
    }
    X.note_groups(groups);
    return true;
  }

  // The routed experts' gate / up / SwiGLU and down products of rows [r0, r0 + n) over their slot numbers (dslot).
  void routed_products(int64_t il, const float* xin, int r0, int n) {
    const HParams& hp = m->hp();
    const BackendExperts& X = *bm->experts;
    const int64_t H = hp.n_embd, k = hp.n_expert_used, F = hp.n_ff_exp, off = r0 * k, S = n * k;
    be->matmul_sel_swiglu(X.view(il, 0), X.slot_bytes(), X.view(il, 1), X.slot_bytes(), dslot.i() + off, (int)S, (int)k,
                          xin + (size_t)r0 * H, H, act.f() + (size_t)off * F, up.f() + (size_t)off * F);
    be->matmul_sel(X.view(il, 2), X.slot_bytes(), dslot.i() + off, (int)S, 1, act.f() + (size_t)off * F, F,
                   yg.f() + (size_t)off * H, H);
  }

  // After the piece that follows host_part was issued: the predicted experts' copies (they overlap it), then the
  // window's pins released.
  void after_launch() {
    if (pending_layer >= 0) bm->experts->prefetch(pending_layer, pending.data(), (int)pending.size());
    pending_layer = -1;
    held_pins.reset();
  }

  void expert_part(const BackendModel::Moe& w, int64_t il, const float* xin, int T, bool routed_done, float* out) {
    const HParams& hp = m->hp();
    BackendExperts& X = *bm->experts;
    const int64_t H = hp.n_embd, k = hp.n_expert_used, F = hp.n_ff_exp, S = (int64_t)T * k;
    const float* shp = nullptr;
    be->fork(w.has_shexp ? 3 : 1);
    be->lane(0);
    if (!routed_done) routed_products(il, xin, 0, T);
    if (w.has_shexp) shp = shared_expert(w, xin, T);
    be->join();
    be->moe_combine(yg.f(), wt.f(), T, (int)k, H, shp, w.gate_inp_shexp, xin, out);
  }

  // Every buffer the streamed MoE uses, at its size for T rows (before any piece is issued: a recorded piece
  // grows nothing).
  void grow_streamed(int T) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, E = hp.n_expert, k = hp.n_expert_used, F = hp.n_ff_exp, S = (int64_t)T * k;
    rl.grow(*be, (size_t)2 * T * E * 4);
    sel.grow(*be, (size_t)2 * S * 4);
    wt.grow(*be, (size_t)2 * S * 4);
    dslot.grow(*be, (size_t)S * 4);
    act.grow(*be, (size_t)S * F * 4);
    up.grow(*be, (size_t)S * F * 4);
    yg.grow(*be, (size_t)S * H * 4);
    if (hp.n_ff_shexp > 0) {
      sa.grow(*be, (size_t)T * hp.n_ff_shexp * 4);
      su.grow(*be, (size_t)T * hp.n_ff_shexp * 4);
      sh.grow(*be, (size_t)T * H * 4);
    }
  }

  // The token embedding rows of tokens[0..T) into dst [T][H] (host), dequantized as the native forward does.
  void embed(const int32_t* tokens, int T, float* dst) const {
    const Weights& W = m->weights();
    const int64_t H = m->hp().n_embd, V = m->hp().n_vocab;
    const TypeTraits* et = type_traits(W.token_embd.type);
    for (int t = 0; t < T; t++) {
      STRATA_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id ", tokens[t], " out of range");
      et->dequant(W.token_embd.data + (size_t)tokens[t] * W.token_embd.row_bytes, dst + (size_t)t * H, H);
    }
  }

  // A pass's inputs in one upload into inb: [kHead int32: pos0, pos0 + 1, 0...][T][H] embeddings, then `extra`
  // floats (the MTP block's hidden rows).
  void upload_inputs(const int32_t* tokens, int T, int64_t pos0, const float* extra = nullptr, size_t n_extra = 0) {
    const int64_t H = m->hp().n_embd;
    emb.assign(kHead + (size_t)T * H + n_extra, 0.f);
    const int32_t head[2] = {(int32_t)pos0, (int32_t)(pos0 + 1)};
    std::memcpy(emb.data(), head, sizeof(head));
    embed(tokens, T, emb.data() + kHead);
    if (n_extra) std::memcpy(emb.data() + kHead + (size_t)T * H, extra, n_extra * 4);
    inb.grow(*be, emb.size() * 4);
    be->upload(inb.p, emb.data(), emb.size() * 4);
  }

  // The embeddings into x (dev: run() uploaded them into inb) and layer 0's norm.
  void head(const int32_t* tokens, int T) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd;
    if (dev) {
      be->copy(x.p, inb.f() + kHead, (size_t)T * H * 4);
    } else {
      emb.resize((size_t)T * H);
      embed(tokens, T, emb.data());
      be->upload(x.p, emb.data(), emb.size() * 4);
    }
    // each residual add is issued with the norm that follows it (add_rmsnorm: the same operations)
    if (hp.n_layer > 0)
      be->rmsnorm(x.f(), H, bm->layers[0].attn_norm, H, T, hp.rms_eps, h.f(), H, bm->layers[0].mixer_in);
  }

  // Layer il's mixer and the residual add with the MoE's norm: h = rmsnorm(x + mixer(h)).
  void mixer(int64_t il, int T, int64_t pos0, bool in_place) {
    const HParams& hp = m->hp();
    const BackendModel::Layer& L = bm->layers[il];
    if (L.recurrent) deltanet(L.dn, dn[slot[il]], h.f(), T, in_place, mix.f());
    else attention(L.attn, kv[slot[il]], h.f(), T, pos0, mix.f());
    be->add_rmsnorm(x.f(), mix.f(), L.post_norm, hp.n_embd, T, hp.rms_eps, h.f(), L.moe_in);
  }

  // After layer il's MoE (in mix): x += mix and the next layer's norm into h, or the output norm into hid_out and
  // the logits of rows [first, T).
  void layer_end(int64_t il, int T, int first, float* hid_out, float* lg_out) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd;
    const bool last = il + 1 == hp.n_layer;
    be->add_rmsnorm(x.f(), mix.f(), last ? bm->output_norm : bm->layers[il + 1].attn_norm, H, T, hp.rms_eps,
                    last ? hid_out : h.f(), last ? act_kind(bm->output.type) : bm->layers[il + 1].mixer_in);
    if (last && first < T) be->matmul(bm->output, hid_out + (size_t)first * H, H, T - first, lg_out, hp.n_vocab);
  }

  // qwen3next.cpp forward_qwen3next over rows [0, T) at pos0; logits of rows [first, T) into logits (backend).
  // key: record it in pieces (streamed experts on a backend that records steps: step_at).
  void forward(const int32_t* tokens, int T, int64_t pos0, bool in_place, int first, float* hid_out, float* lg_out,
               const GraphKey* key = nullptr) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd;
    x.grow(*be, (size_t)T * H * 4);
    h.grow(*be, (size_t)T * H * 4);
    mix.grow(*be, (size_t)T * H * 4);
    be->step_rows(T);
    if (bm->experts) return forward_streamed(tokens, T, pos0, in_place, first, hid_out, lg_out, key);
    head(tokens, T);
    for (int64_t il = 0; il < hp.n_layer; il++) {
      mixer(il, T, pos0, in_place);
      moe(bm->layers[il].moe, h.f(), T, mix.f());
      layer_end(il, T, first, hid_out, lg_out);
    }
    if (hp.n_layer == 0) {
      be->rmsnorm(x.f(), H, bm->output_norm, H, T, hp.rms_eps, hid_out, H, act_kind(bm->output.type));
      if (first < T) be->matmul(bm->output, hid_out + (size_t)first * H, H, T - first, lg_out, hp.n_vocab);
    }
  }

  // forward() with streamed experts, as pieces with a host part between each two: piece 0 is the head, layer 0's
  // mixer and its route_part; piece i > 0 is layer i-1's expert_part and layer_end, then layer i's mixer and
  // route_part. key != nullptr: each piece is a recorded step of its own (piece i: key->piece = i), except a
  // piece after a host part that ran the products itself (its content differs: unrecorded).
  void forward_streamed(const int32_t* tokens, int T, int64_t pos0, bool in_place, int first, float* hid_out,
                        float* lg_out, const GraphKey* key) {
    const HParams& hp = m->hp();
    const int64_t n = hp.n_layer;
    grow_streamed(T);
    held_pins.reset();  // after an error half-way through the last pass: nothing may stay pinned
    pending_layer = -1;
    const std::vector<const void*> s = key ? sig() : std::vector<const void*>{};  // every buffer is grown by now
    bool done = false;
    for (int64_t i = 0; i <= n; i++) {
      auto issue = [&, i, done] {
        if (i == 0) {
          head(tokens, T);
        } else {
          expert_part(bm->layers[i - 1].moe, i - 1, h.f(), T, done, mix.f());
          layer_end(i - 1, T, first, hid_out, lg_out);
        }
        if (i < n) {
          mixer(i, T, pos0, in_place);
          route_part(bm->layers[i].moe, i, h.f(), T);
        }
      };
      if (key && !done) {
        GraphKey k = *key;
        k.piece = (int)i;
        run_recorded(k, issue, &s);
      } else {
        issue();
      }
      after_launch();
      if (i < n) done = host_part(i, h.f(), T);
    }
  }

  void run(const int32_t* tokens, int T, int64_t pos0, bool in_place, bool last_only, float* logits_host,
           float* hidden_host) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, V = hp.n_vocab;
    STRATA_CHECK(in_place || T <= max_window, "backend run: a verify window of ", T, " rows exceeds max_window ",
                 max_window);
    const int step = in_place ? prompt : T;
    hid.grow(*be, (size_t)std::min(T, step) * H * 4);
    logits.grow(*be, (size_t)(last_only ? 1 : std::min(T, step)) * V * 4);  // the rows [first, n) of a pass
    for (int t0 = 0; t0 < T; t0 += step) {
      const int n = std::min(step, T - t0);
      // logits of every row, or only of the window's last row
      const int first = last_only ? (t0 + n == T ? n - 1 : n) : 0;
      if (dev) step_at(tokens + t0, n, pos0 + t0, in_place, first);
      else forward(tokens + t0, n, pos0 + t0, in_place, first, hid.f(), logits.f());
      be->download(hidden_host + (size_t)t0 * H, hid.p, (size_t)n * H * 4);
      if (first < n)
        be->download(logits_host + (last_only ? 0 : (size_t)t0 * V), logits.p, (size_t)(n - first) * V * 4);
    }
    last_T = T;
    last_in_place = in_place;
  }

  // mtp.cpp mtp_forward's operations over n rows at p0 (pos: [p0, p0 + 1] in backend memory, for backends that
  // record steps): embeddings e [n][H] and hidden rows hin [n][H] (backend memory) in, the block's output hidden
  // rows into hout [n][H]; lg: the last row's logits there [V] (null: none), and tok: their argmax (null: none).
  // Issues operations only: run_recorded may record it.
  void mtp_block(const float* e, const float* hin, int n, int64_t p0, const int32_t* pos, float* hout, float* lg,
                 int32_t* tok) {
    const HParams& hp = m->hp();
    const BackendModel::Mtp& M = bm->mtp;
    const int64_t H = hp.n_embd, V = hp.n_vocab;
    be->step_rows(n);
    // [emb | hidden], embedding first (eh_proj reads both halves: no norm's rows alone)
    be->rmsnorm(e, H, M.enorm, H, n, hp.rms_eps, mtp_cat.f(), 2 * H, ActKind::Float);
    be->rmsnorm(hin, H, M.hnorm, H, n, hp.rms_eps, mtp_cat.f() + H, 2 * H, ActKind::Float);
    be->matmul(M.eh_proj, mtp_cat.f(), 2 * H, n, x.f(), H);
    const BackendModel::Layer& L = M.layer;
    be->rmsnorm(x.f(), H, L.attn_norm, H, n, hp.rms_eps, h.f(), H, L.mixer_in);
    attention(L.attn, mtp_kv, h.f(), n, p0, mix.f(), pos);
    be->add_rmsnorm(x.f(), mix.f(), L.post_norm, H, n, hp.rms_eps, h.f(), L.moe_in);
    moe(L.moe, h.f(), n, mix.f());
    // the logits read the last row only (their product: its own quantization)
    be->add_rmsnorm(x.f(), mix.f(), M.shared_head_norm, H, n, hp.rms_eps, hout, ActKind::Float);
    if (!lg) return;
    be->matmul(bm->output, hout + (size_t)(n - 1) * H, H, 1, lg, V);
    if (tok) be->argmax_rows(lg, 1, V, 0, tok);  // all NaN: token 0, as Session::mtp_draft's host pick
  }

  // The buffers a piece of n MTP rows uses, grown before anything is issued (a recorded step grows nothing).
  void mtp_grow(int n) {
    const int64_t H = m->hp().n_embd;
    STRATA_CHECK(bm->mtp.present && mtp_kv.cells > 0, "mtp: this backend session has no MTP block");
    x.grow(*be, (size_t)n * H * 4);
    h.grow(*be, (size_t)n * H * 4);
    mix.grow(*be, (size_t)n * H * 4);
    hid.grow(*be, (size_t)n * H * 4);
    mtp_cat.grow(*be, (size_t)n * 2 * H * 4);
  }

  // A piece's inputs in one upload into inb: [kMtpHead int32: head][n][H] embeddings of tokens, then [n][H] hidden.
  // Returns the embeddings (backend memory); the hidden rows follow them.
  const float* mtp_upload(const std::vector<int32_t>& head_ints, const int32_t* tokens, const float* hidden, int n) {
    const int64_t H = m->hp().n_embd;
    emb.assign(kMtpHead + (size_t)2 * n * H, 0.f);
    std::memcpy(emb.data(), head_ints.data(), std::min(head_ints.size(), kMtpHead) * 4);
    embed(tokens, n, emb.data() + kMtpHead);
    std::memcpy(emb.data() + kMtpHead + (size_t)n * H, hidden, (size_t)n * H * 4);
    inb.grow(*be, emb.size() * 4);
    be->upload(inb.p, emb.data(), emb.size() * 4);
    return inb.f() + kMtpHead;
  }

  // One unrecorded piece of n rows at p0 (hidden [n][H] and the next tokens, host): the block's output rows into hid,
  // the last row's logits into lg (null: none).
  void mtp_piece(const float* hidden_host, const int32_t* next_tokens, int n, int64_t p0, float* lg) {
    mtp_grow(n);
    const float* e = mtp_upload({(int32_t)p0, (int32_t)(p0 + 1)}, next_tokens, hidden_host, n);
    n_cap = p0 + 1;
    mtp_block(e, e + (size_t)n * m->hp().n_embd, n, p0, inb.i(), hid.f(), lg, nullptr);
  }

  // mtp.cpp mtp_forward over T rows at pos0 (in pieces of kChunk rows: the same values): hidden [T][H] and the
  // next tokens (host) in; the block's output hidden rows [T][H] (host) and, if logits_last, the last row's logits.
  // Unrecorded (mtp_prefill: prompt rows, once each).
  void mtp_forward(const float* hidden_host, const int32_t* next_tokens, int T, int64_t pos0, float* out_hidden_host,
                   float* logits_last_host) {
    const int64_t H = m->hp().n_embd, V = m->hp().n_vocab;
    for (int t0 = 0; t0 < T; t0 += kChunk) {
      const int n = std::min(kChunk, T - t0);
      float* lg = t0 + n == T && logits_last_host ? mtp_lg.f() : nullptr;
      mtp_piece(hidden_host + (size_t)t0 * H, next_tokens + t0, n, pos0 + t0, lg);
      be->download(out_hidden_host + (size_t)t0 * H, hid.p, (size_t)n * H * 4);
      if (lg) be->download(logits_last_host, lg, (size_t)V * 4);
    }
  }

  // Session::mtp_draft on the backend, as mtp_forward over the n backlog rows at pos0 then k - 1 chained steps:
  // depth 0 is the block over the last piece of the backlog, its last row's logits and their argmax (draft 0); depth
  // j >= 1 runs the block on one row at position pos0 + n + j - 1, from depth j - 1's output hidden row and draft.
  // Every depth's logits stay in mtp_lg (mtp_logits downloads them), its draft in mtp_tok; the host gets the k
  // drafts in one download.
  //   1. the backlog's pieces before its last (more than kChunk rows: after a long stretch without drafts), one by
  //      one, unrecorded, without outputs;
  //   2. one upload: every depth's position, the last piece's embeddings and hidden rows;
  //   3. token_embd on the backend (can_embed): depths 0 .. k-1 as one recorded step (the embedding of each draft
  //      gathered on the backend); else depth 0, then per depth the previous draft downloaded, embedded on the host
  //      and uploaded, and the depth run: a recorded step each;
  //   4. the k drafts downloaded.
  void mtp_draft(const float* hidden_host, const int32_t* next_tokens, int n, int64_t pos0, int k, int32_t* drafts) {
    const HParams& hp = m->hp();
    const int64_t H = hp.n_embd, V = hp.n_vocab;
    STRATA_CHECK(n >= 1 && k >= 1 && k <= kMtpDepths, "mtp_draft: ", n, " backlog rows, ", k, " drafts (1..",
                 kMtpDepths, ")");
    STRATA_CHECK(pos0 + n + k - 1 <= mtp_kv.cells, "mtp_draft: positions up to ", pos0 + n + k - 2, " exceed the ",
                 mtp_kv.cells, " MTP cells");
    int t0 = 0;
    for (; n - t0 > kChunk; t0 += kChunk)  // 1.
      mtp_piece(hidden_host + (size_t)t0 * H, next_tokens + t0, kChunk, pos0 + t0, nullptr);
    const int r = n - t0;  // 2.
    const int64_t p0 = pos0 + t0;
    auto at = [&](int j) { return j == 0 ? p0 : pos0 + n + j - 1; };  // depth j's (first) position
    std::vector<int32_t> head;
    for (int j = 0; j < k; j++) head.push_back((int32_t)at(j)), head.push_back((int32_t)(at(j) + 1));
    mtp_grow(r);
    const float* e0 = mtp_upload(head, next_tokens + t0, hidden_host + (size_t)t0 * H, r);
    const bool chain = bm->token_embd.data != nullptr;
    const int64_t last = at(k - 1) + (k > 1 ? 1 : r);  // cells the last depth's row sees
    n_cap = dev ? cell_span(last, n_ctx) : last;
    auto depths = [&](int j0, int j1) {  // the operations of depths [j0, j1)
      for (int j = j0; j < j1; j++) {
        const int32_t* pos = inb.i() + 2 * j;
        if (j == 0) {
          mtp_block(e0, e0 + (size_t)r * H, r, p0, pos, hid.f(), mtp_lg.f(), mtp_tok.i());
          continue;
        }
        float* ej = mtp_emb.f() + (size_t)j * H;
        if (chain) be->embed_rows(bm->token_embd, mtp_tok.i() + j - 1, 1, ej);
        const float* hin = j == 1 ? hid.f() + (size_t)(r - 1) * H : mtp_hid.f() + (size_t)(j - 1) * H;
        mtp_block(ej, hin, 1, at(j), pos, mtp_hid.f() + (size_t)j * H, mtp_lg.f() + (size_t)j * V, mtp_tok.i() + j);
      }
    };
    const bool record = dev && r <= kMaxRecordedT;
    auto run_depths = [&](int j0, int j1) {  // 3.
      if (!record) return depths(j0, j1);
      GraphKey key{r, j1, true, n_cap};  // r for every j0: depth 1 reads depth 0's row r - 1
      key.mtp = j0 + 1;
      // the addresses now: an earlier depth of this call, run unrecorded, may have grown a buffer
      std::vector<const void*> s = sig();
      for (const Buf* b : {&mtp_cat, &mtp_kv.k, &mtp_kv.v, &mtp_emb, &mtp_hid, &mtp_lg, &mtp_tok}) s.push_back(b->p);
      run_recorded(key, [&] { depths(j0, j1); }, &s);
    };
    if (chain) {
      run_depths(0, k);
    } else {
      run_depths(0, 1);
      std::vector<float> ev(H);
      for (int j = 1; j < k; j++) {
        int32_t tok = 0;
        be->download(&tok, mtp_tok.i() + j - 1, 4);
        embed(&tok, 1, ev.data());
        be->upload(mtp_emb.f() + (size_t)j * H, ev.data(), (size_t)H * 4);
        run_depths(j, j + 1);
      }
    }
    be->download(drafts, mtp_tok.p, (size_t)k * 4);  // 4.
    mtp_rows = k;
  }

  // The logits of each depth of the last mtp_draft, [mtp_rows][V] (host).
  std::vector<float> mtp_logits() {
    std::vector<float> out((size_t)mtp_rows * m->hp().n_vocab);
    if (!out.empty()) be->download(out.data(), mtp_lg.p, out.size() * 4);
    return out;
  }
  // The MTP cells [pos, pos + n) back to zeros (session.cpp: a backlog re-synced from its last rows).
  void mtp_zero(int64_t pos, int64_t n) {
    const int64_t width = m->hp().n_head_kv * m->hp().head_dim;
    STRATA_CHECK(pos >= 0 && n >= 0 && pos + n <= mtp_kv.cells, "mtp: cells ", pos, "..", pos + n, " outside ", mtp_kv.cells);
    if (n == 0) return;
    const std::vector<float> z((size_t)n * width, 0.f);
    be->upload(mtp_kv.k.f() + pos * width, z.data(), z.size() * 4);
    be->upload(mtp_kv.v.f() + pos * width, z.data(), z.size() * 4);
  }

  // Every buffer of the session: the addresses a recorded step was made for.
  std::vector<const void*> sig() const {
    std::vector<const void*> v;
    for (const Buf* b : {&x, &h, &mix, &hid, &logits, &raw, &rawf, &z, &ba, &fz, &fb, &fa, &hist, &convo, &eg, &beta,
                         &o, &y, &qg, &att, &kvb, &rl, &sel, &wt, &act, &up, &yg, &sa, &su, &sh, &dslot, &inb, &rope_cs,
                         &rope_sn})
      v.push_back(b->p);
    for (const auto& d : dn)
      for (const Buf* b : {&d.S, &d.S_work, &d.conv, &d.conv_rows, &d.eg_rows, &d.beta_rows, &d.raw_rows}) v.push_back(b->p);
    for (const auto& k : kv) v.push_back(k.k.p), v.push_back(k.v.p);
    return v;
  }

  // One forward pass on a backend that records steps: the embeddings and the position in one upload, then the
  // step: the first time a (shape, buffers) is seen it runs unrecorded (and grows what it needs), the second time
  // it is recorded, then replayed; the values are the unrecorded forward's (the same operations on the same
  // addresses, the position read from memory). With streamed experts the step is recorded in pieces, between the
  // host parts (forward_streamed).
  void step_at(const int32_t* tokens, int T, int64_t pos0, bool in_place, int first) {
    STRATA_CHECK(kv.empty() || pos0 + T <= n_ctx, "attention: positions ", pos0, "..", pos0 + T - 1,
                 " exceed the context ", n_ctx);  // a replayed step checks nothing itself
    upload_inputs(tokens, T, pos0);
    if (T > kMaxRecordedT) {  // prompt pieces: once each
      n_cap = pos0 + 1;
      forward(tokens, T, pos0, in_place, first, hid.f(), logits.f());
      return;
    }
    n_cap = cell_span(pos0 + 1, n_ctx);
    const GraphKey key{T, first, in_place, n_cap};
    if (bm->experts) return forward(tokens, T, pos0, in_place, first, hid.f(), logits.f(), &key);
    run_recorded(key, [&] { forward(tokens, T, pos0, in_place, first, hid.f(), logits.f()); });
  }

  // issue() (operations only: no upload, download, sync or growing buffer) as a recorded step for key and the
  // session's buffers: recorded the first time it is seen, replayed after. A first recording that needs a buffer or
  // the backend's scratch to grow aborts (nothing ran, record_abort) and the step runs unrecorded, growing them;
  // with the grown buffers it is a new step (their addresses are part of it), recorded at its first sight. A
  // recording that fails otherwise leaves the step unrecorded for good (broken).
  void run_recorded(const GraphKey& key, const std::function<void()>& issue, const std::vector<const void*>* sig_ = nullptr) {
    const std::vector<const void*> s = sig_ ? *sig_ : sig();
    Recording* r = nullptr;
    for (auto& e : recordings[key])
      if (e.sig == s) r = &e;
    if (r && r->id >= 0) {
      if (be->replay(r->id)) {
        g_replays++;
        return;
      }
      be->forget(r->id);  // stale (the backend's scratch moved): record again
      r->id = -1;
    }
    const bool first = !r;
    if (first) {
      // with streamed experts a step is n_layer + 1 pieces: room for 16 steps' pieces
      const size_t cap = bm->experts ? 16 * ((size_t)m->hp().n_layer + 1) : kMaxRecordings;
      if (n_recordings >= cap) drop_recordings();
      recordings[key].push_back({s});
      n_recordings++;
      r = &recordings[key].back();
    }
    if (r->broken) {  // its unrecorded runs are its steady state
      issue();
      return;
    }
    cold++;  // a recording
    try {
      be->record_begin();
      issue();
      r->id = be->record_end();
    } catch (const std::exception&) {  // nothing ran: the step runs unrecorded (any real error raises there)
      be->record_abort();
      r->broken = !first;
      issue();
      return;
    }
    STRATA_CHECK(be->replay(r->id), "backend ", be->name(), ": a step went stale as it was recorded");
    g_replays++;
  }
  void drop_recordings() {
    for (auto& [k, list] : recordings)
      for (auto& e : list) be->forget(e.id);
    recordings.clear();
    n_recordings = 0;
  }

  // deltanet_state.cpp fold_layers: replay the kept rows into S, or swap S_work in when all were kept; then the
  // kept raw rows into the conv history.
  void commit(int keep) {
    if (last_in_place || last_T == 0) return;
    const HParams& hp = m->hp();
    hist.grow(*be, (size_t)(hp.ssm_d_conv - 1 + keep) * hp.conv_dim() * 4);
    // all kept: S_work becomes S; swapped where nothing is recorded, copied on the backend where steps are recorded (in
    // fold), so that S and S_work keep their addresses: a swap would make each step two recordings, one per order
    // (1.5 MB a window on the default model, 75 MB on the 80B's 36 layers: ~25 us of the card's bandwidth)
    if (keep == last_T && !dev)
      for (auto& st : dn) std::swap(st.S.p, st.S_work.p);
    if (dev && !dn.empty()) {  // the fold's launches as one recorded step per (T, keep) and buffers
      GraphKey key{last_T, keep, false, 0};
      key.mtp = -1;
      run_recorded(key, [&] { fold(keep); });
    } else {
      fold(keep);
    }
    last_T = 0;
  }
  // commit's operations: the kept rows replayed into S (all kept: S_work copied into S, or already swapped in),
  // the conv history.
  void fold(int keep) {
    const HParams& hp = m->hp();
    const int64_t nk = hp.ssm_n_group, nv = hp.ssm_dt_rank, dk = hp.dk(), dv = hp.dv(), cd = hp.conv_dim(),
                  K = hp.ssm_d_conv, key_dim = nk * dk;
    for (auto& st : dn) {
      if (keep != last_T) {
        const DnHeads a{st.conv_rows.f() + key_dim, cd, st.conv_rows.f() + 2 * key_dim, cd, nullptr, 0,
                        st.eg_rows.f(), st.beta_rows.f(), nullptr, 0, nk, nv, dk, dv};
        be->dn_heads(st.S.f(), nullptr, a, keep, keep);
      } else if (dev) {
        be->copy(st.S.f(), st.S_work.f(), st.S.bytes);
      }
      if (K > 1) {
        be->copy(hist.f(), st.conv.f(), (size_t)(K - 1) * cd * 4);
        be->copy(hist.f() + (K - 1) * cd, st.raw_rows.f(), (size_t)keep * cd * 4);
        be->copy(st.conv.f(), hist.f() + (size_t)keep * cd, (size_t)(K - 1) * cd * 4);
      }
    }
  }
};

BackendModel::~BackendModel() = default;

// The parked session when it fits (its state zeroed in place), else a new one (the parked one's memory freed first).
BackendSession::BackendSession(std::shared_ptr<const Model> model, const SessionOptions& opt, const std::string& name) {
  std::shared_ptr<BackendModel> bm = backend_model(model, name);
  std::lock_guard<std::mutex> lk(bm->mu);
  if (bm->parked && bm->parked->fits(opt, bm->mtp.present)) {
    p_ = std::move(bm->parked);
    p_->bm = bm;
    p_->init_state();
    g_adopted++;
    return;
  }
  bm->parked.reset();
  p_ = std::make_unique<Impl>(bm, opt);
}
BackendSession::~BackendSession() {
  std::shared_ptr<BackendModel> bm = p_->bm;
  std::lock_guard<std::mutex> lk(bm->mu);
  p_->park();
  bm->parked = std::move(p_);  // the one parked before is dropped (under this lock)
}

BackendHold::BackendHold(std::shared_ptr<const Model> model, const std::string& name) : p_(backend_model(model, name)) {}
BackendHold::~BackendHold() = default;
int64_t adopted_backend_sessions() { return g_adopted.load(); }
std::string BackendSession::backend_name() const { return p_->be->name(); }
void BackendSession::run(const int32_t* tokens, int T, int64_t pos0, bool in_place, bool last_only, float* logits,
                         float* hidden) {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->run(tokens, T, pos0, in_place, last_only, logits, hidden);
}
void BackendSession::commit(int keep) {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->commit(keep);
}
void BackendSession::mtp_forward(const float* hidden, const int32_t* next_tokens, int T, int64_t pos0,
                                 float* out_hidden, float* logits_last) {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->mtp_forward(hidden, next_tokens, T, pos0, out_hidden, logits_last);
}
void BackendSession::mtp_draft(const float* hidden, const int32_t* next_tokens, int n, int64_t pos0, int k,
                               int32_t* drafts) {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->mtp_draft(hidden, next_tokens, n, pos0, k, drafts);
}
std::vector<float> BackendSession::mtp_logits() {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  return p_->mtp_logits();
}
int64_t BackendSession::cold_steps() const { return p_->cold; }
void BackendSession::mtp_zero(int64_t pos, int64_t n) {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->mtp_zero(pos, n);
}
void BackendSession::reset() {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->reset();
}
void BackendSession::save_state(int64_t pos, int64_t mtp_pos, Checkpoint& cp) {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->save_state(pos, mtp_pos, cp);
}
void BackendSession::load_state(const Checkpoint& cp, bool mtp) {
  std::lock_guard<std::mutex> lk(p_->bm->mu);
  p_->load_state(cp, mtp);
}

}  // namespace strata
