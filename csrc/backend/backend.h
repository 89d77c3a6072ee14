// The backend boundary (issue 19): the operations the model code needs from the machine it computes on,
// behind one small interface implemented per backend (cpu_backend.cpp: today's kernels; cuda_backend.cu: the
// GPU). A backend owns its memory: every pointer handed to an operation lies in that backend's memory
// (host memory for the CPU, the card for CUDA), placed there by alloc + upload; MatView::data likewise.
//
// Exactness contract (engine spec 2.5), the same for every backend: each output row is a function of its own
// input row(s) and the weights only, never of T, of the other rows of the window or of a thread or block
// partition, so a T-row call equals T one-row calls bit for bit (windows stay bit-identical to serial decoding on
// every backend). Products follow matmul.h's stated lane order (the CUDA kernels compute exactly those float32
// operations, so they equal the CPU's bit for bit); norms follow ops.h.
//
// Host-side descriptions (the DnRow array, AttendArgs, SamplingParams) live in host memory; the pointers inside them
// and every array argument (logits, tokens, sel / wt, out) are the backend's memory.
//
// Status (fourth milestone of issue 19): the CPU backend forwards every operation to the code the CPU model uses
// (kernels, ops.h, rowops.h); the model's forward over this interface is model/backend_forward.cpp (the native CPU
// forward, csrc/model/*.cpp, still calls the kernels directly and stays the default). The CUDA backend implements
// every operation with the CPU backend's results: products, norms, the layer operations and attend bit for bit
// (attend: attend_ref's order; the libm exp / log1p of the gates: ported, kernels/cuda/libm_inl.cuh), moe_route bit
// for bit, sample_rows the same tokens (one stated bound, kernels/cuda/sample.cu). No operation uses a float order
// of its own on the GPU: the GPU session's logits equal the CPU session's (scalar kernels) bit for bit, recorded
// steps (CUDA graphs) included.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/attend.h"
#include "kernels/matmul.h"
#include "sampling/sampler.h"
#include "state/deltanet_state.h"
#include "util/common.h"

namespace strata {

// Every value head of a DeltaNet layer through T rows (dn_heads): row t, value head h (key head g = h / (nv / nk))
// reads k at k + t * ldk + g * dk, v at v + t * ldv + h * dv, q at q + t * ldq + g * dk (unused without o),
// eg[t * nv + h], beta[t * nv + h] (backend memory), and writes o + t * ldo + h * dv (o == nullptr: update only).
// Head h's state is S + h * dk * dv (and S_work's).
struct DnHeads {
  const float* k;
  int64_t ldk;
  const float* v;
  int64_t ldv;
  const float* q;
  int64_t ldq;
  const float* eg;
  const float* beta;
  float* o;
  int64_t ldo;
  int64_t nk, nv, dk, dv;
};

// DeltaNet's causal conv and gates over a window's T rows (dn_conv_gates; deltanet.cpp): raw [T][cd] (the
// projection's q | k | v channels), state [K-1][cd] (the committed conv history), w_t [K][cd]. hist = state ++ raw
// ([K-1+T][cd], scratch), out = conv_silu(hist) ([T][cd]), then dn_gates(out, ba, ...) into out, eg and beta ([T][nv]);
// then in place: state = hist's last K-1 rows; otherwise (a window to verify) the fold's replay rows: conv_rows = out,
// eg_rows = eg, beta_rows = beta, raw_rows = raw.
struct DnConv {
  const float* raw;
  float* state;
  float* hist;
  const float* w_t;
  int T;
  int64_t cd;
  int K;
  const float* ba;
  const float* ssm_a;
  const float* dt_bias;
  int64_t nk, nv, dk;
  float* out;
  float* eg;
  float* beta;
  bool in_place;
  float *conv_rows, *eg_rows, *beta_rows, *raw_rows;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)"

  // Memory this backend computes on. alloc of 0 bytes returns nullptr; release(nullptr) does nothing.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void sync() = 0;  // wait until every operation issued so far has finished

  // Expert streaming (backend_experts.h): host memory the backend copies from fast (CUDA: pinned; the default:
  // plain aligned memory), and host-to-backend copies that overlap compute. upload_async(dst, src, n) issues the
  // copy on the backend's copy lane (src: host_alloc memory, unchanged until the copy is fenced); fence_uploads()
  // makes every operation issued after it, on the current lane, wait for every copy issued before it. The default
  // copies at once (upload), which is already fenced.
  virtual void* host_alloc(size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) fail<std::runtime_error>("backend ", name(), ": cannot allocate ", bytes, " bytes of host memory");
    return p;
  }
  virtual void host_release(void* p) { std::free(p); }
  virtual void upload_async(void* dst, const void* host_src, size_t bytes) { upload(dst, host_src, bytes); }
  virtual void fence_uploads() {}
  // Host memory reused for copies (backend_experts.h's staging of experts read from the file): mark_uploads(i) marks
  // the copy lane after every copy issued so far (mark i, i >= 0, replacing an earlier mark i); wait_uploads(i)
  // blocks the host until the copies before mark i have finished (at once if mark i was never made), so that their
  // source memory may be rewritten. The default copies at once: nothing to wait for.
  virtual void mark_uploads(int i) {}
  virtual void wait_uploads(int i) {}
  // A download in stream order (host_dst: host_alloc memory), allowed inside a recording; the host may read it after
  // the next sync(). The default downloads at once.
  virtual void download_async(void* host_dst, const void* src, size_t bytes) { download(host_dst, src, bytes); }

  // Independent work side by side (no effect on any value): fork(n) opens n lanes that start after everything
  // issued so far; lane(i) sends the operations issued next to lane i; join() waits for every lane, and later
  // operations follow them all. Operations in different lanes must not touch the same memory. The CPU backend runs
  // everything in order (its operations are parallel inside); CUDA: one stream per lane.
  virtual void fork(int n) {}
  // The rows of the step (a forward of T rows) whose operations are issued next: a launch-shape hint, no value
  // depends on it (CUDA: verify windows of 5..16 rows launch without programmatic dependent launch).
  virtual void step_rows(int T) {}
  // Rows a prompt window's forward passes take at a time (in place: every row's values are the same in any pieces,
  // so this is a speed and memory choice only). The CPU backend: 64; CUDA: 512 (the expert products of a piece are
  // grouped by expert: more rows, more slots an expert's weights serve; cuda_prefer_prompt_rows for the A/B).
  virtual int prompt_rows() const { return 64; }
  virtual void lane(int i) {}
  virtual void join() {}

  // T-row products, any T >= 1: y[t * ldy + r] = sum_c W[r][c] * x[t * ldx + c] (matmul.h).
  virtual void matmul(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy) = 0;
  // T rows of n: y[t] = (x[t] * rsqrt(mean(x[t]^2) + eps)) * w (ops.h rmsnorm, its 16-lane sum of squares).
  // feeds: the act_kind of the products that read y next (Float: none, or float-activation ones). A backend may
  // quantize y for them along with the norm (CUDA: in the norm's kernel, once for every lane of the fork that
  // follows), exactly as those products would; no value changes.
  virtual void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y,
                       int64_t ldy, ActKind feeds) = 0;
  // The residual add and the next norm: x = x + y over T rows of n (contiguous), then out = rmsnorm(x; w, eps)
  // ([T][n]), feeds as rmsnorm's. Exactly add then rmsnorm (the default); one kernel on the GPU.
  virtual void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int T, float eps, float* out,
                           ActKind feeds) {
    add(x, y, (int64_t)T * n);
    rmsnorm(x, n, w, n, T, eps, out, n, feeds);
  }
  // DeltaNet: one value head through a window's T rows, rows < n_src also updating S (deltanet_state.h dn_rows);
  // the fold replays kept rows through the same call.
  virtual void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) = 0;
  // Causal attention of T rows x nh query heads over one KV head's cells (attend.h).
  virtual void attend(const AttendArgs& a) = 0;
  // MoE routing of T rows over E experts: softmax in fp32, top-k (ties: the lower id), weights renormalised over
  // the k (moe.cpp); sel[t * k + j], wt[t * k + j]. The expert union of the window is the set of sel's values.
  virtual void moe_route(const float* logits, int T, int64_t E, int k, int32_t* sel, float* wt) = 0;
  // Expert products over a device-side selection: slot s < n gets y[s * ldy ..] = W_e . x[(s / xdiv) * ldx ..]
  // with e = sel[s] and W_e the rows x cols matrix at W0.data + e * expert_bytes (W0: expert 0's view). Each slot's
  // values are those of a one-row matmul of its expert, so the slots' batching never shows.
  virtual void matmul_sel(const MatView& W0, size_t expert_bytes, const int32_t* sel, int n, int xdiv, const float* x,
                          int64_t ldx, float* y, int64_t ldy) = 0;
  // The experts' gate and up products over one selection, then SwiGLU: g[s] = W_gate,e . x[s / xdiv],
  // u[s] = W_up,e . x[s / xdiv], g[s] = silu(g[s]) * u[s] (n slots of Wg.rows floats each, contiguous). The default is
  // those three operations; a backend may do them in one pass (CUDA: IQ2_XXS), with the same values.
  virtual void matmul_sel_swiglu(const MatView& Wg, size_t gate_bytes, const MatView& Wu, size_t up_bytes,
                                 const int32_t* sel, int n, int xdiv, const float* x, int64_t ldx, float* g, float* u) {
    matmul_sel(Wg, gate_bytes, sel, n, xdiv, x, ldx, g, Wg.rows);
    matmul_sel(Wu, up_bytes, sel, n, xdiv, x, ldx, u, Wu.rows);
    silu_mul(g, u, (int64_t)n * Wg.rows);
  }

  // The layers' elementwise and per-row operations, each the CPU model's own code (ops.h, rowops.h) on the CPU
  // backend and the same float operations in the same order on the others.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // within this backend's memory
  virtual void add(float* x, const float* y, int64_t n) = 0;        // x = x + y (the residual add)
  // rowops causal_conv_silu: hist [K-1+T][ld], w_t [K][ld], out [T][ld], channels c < n.
  virtual void conv_silu(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out) = 0;
  // DeltaNet's per-row gates (deltanet.cpp), T rows of conv [T][ld] (q_all | k_all | v, key head g's q at g * dk,
  // its k at nk * dk + g * dk) and ba [T][nk][b(r) | a(r)]: q <- l2norm(q) * (1 / sqrt(dk)), k <- l2norm(k),
  // beta[t][h] = sigmoid(b), eg[t][h] = exp(ssm_a[h] * softplus(a + dt_bias[h])) (libm exp / log1p, ops.h).
  virtual void dn_gates(float* conv, int64_t ld, const float* ba, const float* ssm_a, const float* dt_bias, int T,
                        int64_t nk, int64_t nv, int64_t dk, float* eg, float* beta) = 0;
  // DnConv's sequence: the copies into hist, conv_silu, dn_gates, then the state's or the replay rows' copies (the
  // default issues exactly those operations; CUDA: one kernel for windows of up to 16 rows, the same values).
  virtual void dn_conv_gates(const DnConv& a) {
    const size_t row = (size_t)a.cd * sizeof(float), K1 = (size_t)(a.K - 1);
    if (K1) copy(a.hist, a.state, K1 * row);
    copy(a.hist + K1 * a.cd, a.raw, (size_t)a.T * row);
    conv_silu(a.hist, a.w_t, a.T, a.cd, a.cd, a.K, a.out);
    dn_gates(a.out, a.cd, a.ba, a.ssm_a, a.dt_bias, a.T, a.nk, a.nv, a.dk, a.eg, a.beta);
    if (a.in_place) {
      if (K1) copy(a.state, a.hist + (size_t)a.T * a.cd, K1 * row);
      return;
    }
    copy(a.conv_rows, a.out, (size_t)a.T * row);
    copy(a.eg_rows, a.eg, (size_t)a.T * a.nv * sizeof(float));
    copy(a.beta_rows, a.beta, (size_t)a.T * a.nv * sizeof(float));
    copy(a.raw_rows, a.raw, (size_t)a.T * row);
  }
  // dn_rows for every value head of a layer in one call (a.nv heads, T rows, n_src as in dn_rows).
  virtual void dn_heads(float* S, float* S_work, const DnHeads& a, int T, int n_src) = 0;
  // Qwen3.5's tiled value heads (deltanet.cpp, DnLayout::Split) to the grouped order, per row t: raw = rawf with
  // its v channels (from 2 * key_dim on) permuted, v head j = file head
  // file_head[j]; z head j = fz head file_head[j]; ba[t][(j / r) * 2r + j % r] = fb[t][file_head[j]] and
  // ba[t][(j / r) * 2r + r + j % r] = fa[t][file_head[j]]. Data movement only.
  virtual void dn_untile(const float* rawf, float* raw, int64_t cd, int64_t key_dim, const float* fz, float* z,
                         const float* fb, const float* fa, float* ba, const int32_t* file_head, int T, int64_t nk,
                         int64_t nv, int64_t dv) = 0;
  // And back for ssm_out's columns: out[t][file_head[j] * dv ..] = y[t][j * dv ..] (dv floats per head).
  virtual void dn_retile(const float* y, float* out, const int32_t* file_head, int T, int64_t nv, int64_t dv) = 0;
  // rows of n: y = rmsnorm(x; w, eps) then y *= silu(z) (rowops mul_silu) or sigmoid(z) (mul_sigmoid); x, z, y
  // [rows][n] contiguous.
  virtual void gated_norm(const float* x, const float* w, const float* z, int64_t n, int rows, float eps, bool sigmoid,
                          float* y) = 0;
  // gated_norm over T rows of `heads` heads (rows = T * heads; y [T][heads * n]), feeds as rmsnorm's: the products
  // that read y next (CUDA: y quantized for them in the norm's kernel). The default: gated_norm.
  virtual void gated_norm_rows(const float* x, const float* w, const float* z, int64_t n, int heads, int T, float eps,
                               bool sigmoid, float* y, ActKind feeds) {
    gated_norm(x, w, z, n, T * heads, eps, sigmoid, y);
  }
  // rows of n: o[r * ldo + i] *= sigmoid(g[r * ldg + i]) (rowops mul_sigmoid).
  virtual void mul_sigmoid_rows(float* o, int64_t ldo, const float* g, int64_t ldg, int64_t n, int rows) = 0;
  virtual void silu_mul(float* g, const float* u, int64_t n) = 0;  // g = silu(g) * u (rowops silu_mul)
  // Attention's per-head norm and rotation (attention.cpp): row t, head h at x + t * ldt + h * ldh (hd floats) gets
  // rmsnorm(w, eps) in place, then rope_neox of its first n_rot dims with the angles of position pos0 + t, read
  // from cs / sn [position][n_rot / 2] (ops.h rope_angles, filled on the host).
  virtual void norm_rope(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps,
                         const float* cs, const float* sn, int64_t n_rot, int64_t pos0) = 0;
  // MoE's combine (moe.cpp): out[t] = sum_j wt[t * k + j] * yg[t * k + j] (axpy in rank order from 0), then with a
  // shared expert (sh != nullptr) + sigmoid(gl) * sh[t], gl = the running sum of gate_shexp[i] * x[t][i].
  virtual void moe_combine(const float* yg, const float* wt, int T, int k, int64_t H, const float* sh,
                           const float* gate_shexp, const float* x, float* out) = 0;

  // Recorded steps (CUDA graphs): a backend where can_record() is true keeps the operations issued between
  // record_begin() and record_end() (issued, not run) as one step that replay(id) runs again with the same
  // arguments, in a few host calls instead of one launch per operation. Whatever changes between replays must live
  // in backend memory (the position ops below read it there). replay returns false when the recording went stale
  // (the backend moved its own scratch since): record again. Nothing may wait on the backend inside a recording
  // (no upload, download, sync or growing buffer); record_abort() drops a recording that failed half-way.
  virtual bool can_record() const { return false; }
  virtual void record_begin() { fail<std::logic_error>("backend ", name(), " does not record steps"); }
  virtual int record_end() { fail<std::logic_error>("backend ", name(), " does not record steps"); }
  virtual void record_abort() {}
  virtual bool replay(int id) { fail<std::logic_error>("backend ", name(), " does not record steps"); }
  virtual void forget(int id) {}
  // The position-dependent operations of a recorded step, with the position in backend memory: norm_rope at
  // position *pos; attend with row 0 seeing *n cells (a.n: the most it will be: launch shape and scratch); rows t of
  // k and v ([T][width]) into the cache rows *pos + t. Same values as norm_rope / attend at those positions.
  virtual void norm_rope_at(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps,
                            const float* cs, const float* sn, int64_t n_rot, const int32_t* pos) {
    fail<std::logic_error>("backend ", name(), " has no norm_rope_at");
  }
  virtual void attend_at(const AttendArgs& a, const int32_t* n) {
    fail<std::logic_error>("backend ", name(), " has no attend_at");
  }
  virtual void kv_store(const float* k, const float* v, int T, int64_t width, float* kc, float* vc,
                        const int32_t* pos) {
    fail<std::logic_error>("backend ", name(), " has no kv_store");
  }

  // MoE's shared-expert gates of T rows of x, issued ahead of moe_combine (on the shared expert's lane, off the
  // routed experts' path); moe_combine with the same gate_shexp, x and T then uses them. The same values either way;
  // the default leaves them to moe_combine.
  virtual void moe_shared_gate(const float* gate_shexp, const float* x, int T, int64_t H) {}

  // The greedy pick of T rows on the backend (the MTP drafts: one int a row crosses, not the row): out[t] =
  // sampler.h argmax of row t (the largest non-NaN logit, its lowest id), or `none` where argmax is -1 (every logit
  // NaN or -inf). out: backend memory. Issues work only (no sync), so it may be part of a recorded step.
  virtual void argmax_rows(const float* logits, int T, int64_t n_vocab, int32_t none, int32_t* out) = 0;
  // Token embedding rows gathered on the backend (the MTP drafts chained on the card): out[t][0..table.cols) =
  // row ids[t] of table (backend memory, its GGUF bytes), dequantized exactly as types.h's dequantizer does; ids
  // (backend memory) must lie in [0, table.rows). can_embed(type): whether this backend decodes that type here
  // (the CPU: every type with a dequantizer; CUDA: F32, F16, BF16, Q8_0); the forward embeds on the host otherwise.
  virtual bool can_embed(uint32_t type) const { return false; }
  virtual void embed_rows(const MatView& table, const int32_t* ids, int T, float* out) {
    fail<std::logic_error>("backend ", name(), " has no embed_rows");
  }

  // The window finish (sampler.h sample_rows): logits[T][n_vocab] -> out[T].
  virtual void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p,
                           const int32_t* committed, int64_t n_committed, const int32_t* inputs, int64_t pos0,
                           int32_t* out) = 0;
};

// The CPU backend: host memory, the kernels of the active ISA (matmul.h, attend.h, ...) on `threads` threads.
std::unique_ptr<Backend> make_cpu_backend(int threads);
// The CUDA backend on device `device`; RuntimeError when strata was built without CUDA or no device is usable.
std::unique_ptr<Backend> make_cuda_backend(int device);

// Whether a CUDA device is usable (built with CUDA, a driver, at least one device); never throws.
bool cuda_available();
// One line per device ("0: NVIDIA H200, sm_90, 132 SMs, 140 GiB"), or why none is usable.
std::string cuda_info();

}  // namespace strata
