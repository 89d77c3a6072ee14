// The CUDA backend: one device, one stream (and lanes), recorded steps as CUDA graphs; weights and activations in device memory (cudaMalloc). Every operation
// of the interface runs on the card (kernels/cuda/), with the CPU backend's results (ops_cuda.h, matmul_cuda.h).
// Every CUDA call's status is checked, every launch's too.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_bench.h"
#include "kernels/cuda/matmul_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/quants.h"
#include "util/common.h"

namespace strata {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail<std::runtime_error>("cuda: ", what, ": ", cudaGetErrorString(e));
}

// Backend::prompt_rows on the card (cuda_prefer_prompt_rows): 512 rows a prompt piece, against 64 before
// (docs/BENCHMARKS.md, issue 19's fourteenth milestone).
int g_prompt_rows = 512;
bool g_dn_conv_fused = true;  // cuda_prefer_dn_conv_fused: dn_conv_gates in one kernel (windows of up to 16 rows)

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
      cudaGetLastError();
      fail<std::runtime_error>("cuda backend: no usable CUDA device ", device, " (", cuda_info(), ")");
    }
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp p;
    check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    name_ = cat("cuda:", device, " (", p.name, ")");
    check(cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking), "cudaStreamCreate");
    stream_ = main_;
    static std::once_flag tables[64];
    std::call_once(tables[device % 64], [] { cuda::init_tables(); });
  }
  ~CudaBackend() override {
    cudaSetDevice(device_);
    for (auto& sc : scratch_)
      if (sc.p) cudaFree(sc.p);
    if (aux_) cudaFree(aux_);
    for (int i = 0; i < kLanes; i++) {
      if (lanes_[i]) cudaStreamDestroy(lanes_[i]);
      if (lane_done_[i]) cudaEventDestroy(lane_done_[i]);
    }
    if (forked_ev_) cudaEventDestroy(forked_ev_);
    if (copy_) cudaStreamSynchronize(copy_), cudaStreamDestroy(copy_);
    if (copied_) cudaEventDestroy(copied_);
    for (cudaEvent_t e : marks_)
      if (e) cudaEventDestroy(e);
    for (auto& g : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    cudaStreamDestroy(main_);
  }
  // Lanes: streams that wait for an event recorded on the main stream at fork, and the main stream waits for each
  // lane's event at join. Each lane has its own scratch, so products in different lanes never share it.
  void fork(int n) override {
    STRATA_CHECK(stream_ == main_ && n_forked_ == 0, "cuda backend: fork inside a fork");
    STRATA_CHECK(n >= 1 && n <= kLanes, "cuda backend: fork(", n, "): 1..", kLanes, " lanes");
    use_keep();  // the main stream's quantized rows serve every lane (q_hit)
    if (!forked_ev_) {
      check(cudaEventCreateWithFlags(&forked_ev_, cudaEventDisableTiming), "cudaEventCreate");
      for (int i = 0; i < kLanes; i++) {
        check(cudaStreamCreateWithFlags(&lanes_[i], cudaStreamNonBlocking), "cudaStreamCreate");
        check(cudaEventCreateWithFlags(&lane_done_[i], cudaEventDisableTiming), "cudaEventCreate");
      }
    }
    check(cudaEventRecord(forked_ev_, main_), "cudaEventRecord");
    for (int i = 0; i < n; i++) check(cudaStreamWaitEvent(lanes_[i], forked_ev_, 0), "cudaStreamWaitEvent");
    n_forked_ = n;
  }
  void lane(int i) override {
    STRATA_CHECK(i >= 0 && i < n_forked_, "cuda backend: lane(", i, ") outside the ", n_forked_, " forked lanes");
    stream_ = lanes_[i];
    cur_ = i + 1;
  }
  void join() override {
    forget_q();
    for (int i = 0; i < n_forked_; i++) {
      check(cudaEventRecord(lane_done_[i], lanes_[i]), "cudaEventRecord");
      check(cudaStreamWaitEvent(main_, lane_done_[i], 0), "cudaStreamWaitEvent");
    }
    n_forked_ = 0;
    stream_ = main_;
    cur_ = 0;
  }
  std::string name() const override { return name_; }
  void step_rows(int T) override { cuda::step_rows(T); }
  int prompt_rows() const override { return g_prompt_rows; }
  cudaStream_t stream() const { return stream_; }
  // Every operation but the products starts here: it may write any memory, so no quantized activation is reused
  // past it.
  void use() {
    forget_q();
    use_keep();
  }
  void use_keep() {
    if (!capturing_) check(cudaSetDevice(device_), "cudaSetDevice");
  }
  void forget_q() {
    for (auto& q : qc_) q = {};
  }

  // Recorded steps: stream capture of the main stream (the lanes join it through their fork / join events), one
  // instantiated graph per recording. epoch_ counts the moves of this backend's own scratch: a graph recorded
  // before a move would read freed memory, so replay refuses it.
  bool can_record() const override { return true; }
  void record_begin() override {
    STRATA_CHECK(!capturing_ && stream_ == main_ && n_forked_ == 0, "cuda backend: record_begin inside a recording or fork");
    use();
    check(cudaStreamBeginCapture(main_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    capturing_ = true;
    capture_epoch_ = epoch_;
  }
  int record_end() override {
    STRATA_CHECK(capturing_, "cuda backend: record_end without record_begin");
    forget_q();
    capturing_ = false;
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(main_, &g), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    check(e, "cudaGraphInstantiate");
    STRATA_CHECK(capture_epoch_ == epoch_, "cuda backend: the scratch moved during a recording");
    for (size_t i = 0; i < graphs_.size(); i++)
      if (!graphs_[i].exec) {
        graphs_[i] = {exec, capture_epoch_};
        return (int)i;
      }
    graphs_.push_back({exec, capture_epoch_});
    return (int)graphs_.size() - 1;
  }
  void record_abort() override {
    forget_q();
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(main_, &g);  // invalidated captures return an error: nothing to keep either way
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    n_forked_ = 0;
    stream_ = main_;
    cur_ = 0;
  }
  bool replay(int id) override {
    STRATA_CHECK(id >= 0 && (size_t)id < graphs_.size() && graphs_[id].exec, "cuda backend: no recording ", id);
    if (graphs_[id].epoch != epoch_) return false;
    use();
    check(cudaGraphLaunch(graphs_[id].exec, main_), "cudaGraphLaunch");
    return true;
  }
  void forget(int id) override {
    if (id < 0 || (size_t)id >= graphs_.size() || !graphs_[id].exec) return;
    cudaGraphExecDestroy(graphs_[id].exec);
    graphs_[id].exec = nullptr;
  }
  void norm_rope_at(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps,
                    const float* cs, const float* sn, int64_t n_rot, const int32_t* pos) override {
    use_keep();
    written(x, ((T - 1) * ldt + (nh - 1) * ldh + hd) * sizeof(float));
    cuda::norm_rope_at(x, ldt, ldh, T, nh, w, hd, eps, cs, sn, n_rot, pos, stream_);
  }
  void attend_at(const AttendArgs& a, const int32_t* n) override {
    use();
    cuda::attend(a, static_cast<float*>(scratch((size_t)attend_scratch(a) * sizeof(float))), stream_, n);
  }
  void kv_store(const float* k, const float* v, int T, int64_t width, float* kc, float* vc,
                const int32_t* pos) override {
    use();
    cuda::kv_store(k, v, T, width, kc, vc, pos, stream_);
  }

  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    use();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail<std::runtime_error>("cuda backend: cannot allocate ", bytes, " bytes on ", name_, ": ", cudaGetErrorString(e));
    }
    return p;
  }
  void release(void* p) override {
    if (p) cudaFree(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    STRATA_CHECK(!capturing_, "cuda backend: upload inside a recording");
    use();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    sync();
  }
  void download(void* dst, const void* src, size_t bytes) override {
    STRATA_CHECK(!capturing_, "cuda backend: download inside a recording");
    use();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    sync();
  }
  // Expert streaming: pinned host memory, copies on a copy stream of their own, fenced by an event the current
  // lane waits for.
  void* host_alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    use();
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail<std::runtime_error>("cuda backend: cannot allocate ", bytes, " bytes of pinned host memory: ",
                               cudaGetErrorString(e));
    }
    return p;
  }
  void host_release(void* p) override {
    if (p) cudaFreeHost(p);
  }
  void upload_async(void* dst, const void* src, size_t bytes) override {
    STRATA_CHECK(!capturing_, "cuda backend: upload_async inside a recording");
    use();
    if (!copy_) {
      check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate");
      check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreate");
    }
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_), "upload_async");
    copies_ = true;
  }
  void mark_uploads(int i) override {
    STRATA_CHECK(i >= 0, "cuda backend: mark_uploads(", i, ")");
    STRATA_CHECK(!capturing_, "cuda backend: mark_uploads inside a recording");
    use();
    if (!copy_) return;  // no copy issued yet: nothing to wait for
    if ((size_t)i >= marks_.size()) marks_.resize((size_t)i + 1, nullptr);
    if (!marks_[i]) check(cudaEventCreateWithFlags(&marks_[i], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(marks_[i], copy_), "cudaEventRecord");
  }
  void wait_uploads(int i) override {
    STRATA_CHECK(!capturing_, "cuda backend: wait_uploads inside a recording");
    if (i < 0 || (size_t)i >= marks_.size() || !marks_[i]) return;
    use();
    check(cudaEventSynchronize(marks_[i]), "cudaEventSynchronize");
  }
  void download_async(void* dst, const void* src, size_t bytes) override {
    use();
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download_async");
  }
  void fence_uploads() override {
    if (!copies_) return;
    use();
    check(cudaEventRecord(copied_, copy_), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, copied_, 0), "cudaStreamWaitEvent");
    copies_ = false;
  }
  void sync() override {
    STRATA_CHECK(!capturing_, "cuda backend: sync inside a recording");
    check(cudaStreamSynchronize(stream_), "stream synchronize");
    if (stream_ == main_)  // lanes not joined yet finish too
      for (int i = 0; i < n_forked_; i++) check(cudaStreamSynchronize(lanes_[i]), "stream synchronize");
  }

  // Products of int8-activation types reuse quantized rows (q_hit) when they are rows of the same x (ldx, cols,
  // act_kind) quantized by the lane's last product, or by the norm that wrote them (feeds), and nothing that may
  // have written them ran on the backend since (gate and up of the same rows, every lane of a fork: one
  // quantization).
  void matmul(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy) override {
    use_keep();
    void* sc = scratch(cuda::matmul_scratch_bytes(W.type, T, W.cols));
    const ActKind kind = act_kind(W.type);
    cuda::QRows pre;
    const bool hit = kind != ActKind::Float && q_hit(kind, x, ldx, T, W.cols, pre);
    cuda::matmul(W, x, ldx, T, y, ldy, sc, stream_, hit ? &pre : nullptr);
    if (kind != ActKind::Float && !hit) cache_q(kind, x, ldx, T, W.cols, sc);
    written(y, ((T - 1) * ldy + W.rows) * sizeof(float));
  }
  void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y, int64_t ldy,
               ActKind feeds) override {
    use();
    void* qd = cuda::norm_quantizes(feeds, n) ? scratch(cuda::act_bytes(feeds, T, n)) : nullptr;
    if (cuda::rmsnorm(x, ldx, w, n, T, eps, y, ldy, stream_, feeds, qd)) cache_q(feeds, y, ldy, T, n, qd);
  }
  void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int T, float eps, float* out,
                   ActKind feeds) override {
    use();
    void* qd = cuda::norm_quantizes(feeds, n) ? scratch(cuda::act_bytes(feeds, T, n)) : nullptr;
    if (!cuda::add_rmsnorm(x, y, w, n, T, eps, out, stream_, feeds, qd)) {
      Backend::add_rmsnorm(x, y, w, n, T, eps, out, ActKind::Float);
      return;
    }
    if (qd) cache_q(feeds, out, n, T, n, qd);
  }
  void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) override {
    use();
    cuda::dn_rows(S, S_work, rows, T, n_src, dk, dv, stream_);
  }
  void attend(const AttendArgs& a) override {
    use();
    cuda::attend(a, static_cast<float*>(scratch((size_t)attend_scratch(a) * sizeof(float))), stream_);
  }
  void moe_route(const float* logits, int T, int64_t E, int k, int32_t* sel, float* wt) override {
    use_keep();
    written(sel, (size_t)T * k * sizeof(int32_t));
    written(wt, (size_t)T * k * sizeof(float));
    cuda::moe_route(logits, T, E, k, sel, wt, stream_);
  }
  void matmul_sel(const MatView& W0, size_t expert_bytes, const int32_t* sel, int n, int xdiv, const float* x,
                  int64_t ldx, float* y, int64_t ldy) override {
    use_keep();
    const int n_x = (n + xdiv - 1) / xdiv;
    void* sc = scratch(cuda::matmul_sel_scratch_bytes(W0.type, n, xdiv, W0.cols));
    const ActKind kind = act_kind(W0.type);
    cuda::QRows pre;
    const bool hit = kind != ActKind::Float && q_hit(kind, x, ldx, n_x, W0.cols, pre, true);
    cuda::matmul_sel(W0, expert_bytes, sel, n, xdiv, x, ldx, y, ldy, sc, stream_, hit ? &pre : nullptr);
    if (kind != ActKind::Float && !hit) cache_q(kind, x, ldx, n_x, W0.cols, sc);
    written(y, ((int64_t)(n - 1) * ldy + W0.rows) * sizeof(float));
  }
  void matmul_sel_swiglu(const MatView& Wg, size_t gate_bytes, const MatView& Wu, size_t up_bytes, const int32_t* sel,
                         int n, int xdiv, const float* x, int64_t ldx, float* g, float* u) override {
    use_keep();
    const int n_x = (n + xdiv - 1) / xdiv;
    void* sc = scratch(cuda::matmul_sel_scratch_bytes(Wg.type, n, xdiv, Wg.cols));
    cuda::QRows pre;
    const bool hit = int_act_type(Wg.type) && q_hit(ActKind::Q8_256, x, ldx, n_x, Wg.cols, pre, true);
    if (!cuda::matmul_sel_swiglu(Wg, gate_bytes, Wu, up_bytes, sel, n, xdiv, x, ldx, g, u, sc, stream_,
                                 hit ? &pre : nullptr)) {
      Backend::matmul_sel_swiglu(Wg, gate_bytes, Wu, up_bytes, sel, n, xdiv, x, ldx, g, u);
      return;
    }
    if (!hit) cache_q(ActKind::Q8_256, x, ldx, n_x, Wg.cols, sc);
    written(g, (int64_t)n * Wg.rows * sizeof(float));
    written(u, (int64_t)n * Wu.rows * sizeof(float));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    use();
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
  }
  void add(float* x, const float* y, int64_t n) override {
    use();
    cuda::add(x, y, n, stream_);
  }
  void conv_silu(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out) override {
    use();
    cuda::conv_silu(hist, w_t, T, n, ld, K, out, stream_);
  }
  void dn_gates(float* conv, int64_t ld, const float* ba, const float* ssm_a, const float* dt_bias, int T, int64_t nk,
                int64_t nv, int64_t dk, float* eg, float* beta) override {
    use();
    const float qscale = 1.f / std::sqrt((float)dk);  // deltanet.cpp's, on the host
    cuda::dn_gates(conv, ld, ba, ssm_a, dt_bias, T, nk, nv, dk, qscale, eg, beta, stream_);
  }
  void dn_conv_gates(const DnConv& a) override {
    use();
    const float qscale = 1.f / std::sqrt((float)a.dk);  // deltanet.cpp's, on the host
    if (g_dn_conv_fused && cuda::dn_conv_gates(a, qscale, stream_)) return;
    Backend::dn_conv_gates(a);
  }
  void dn_heads(float* S, float* S_work, const DnHeads& a, int T, int n_src) override {
    use();
    cuda::dn_heads(S, S_work, a, T, n_src, stream_);
  }
  void dn_untile(const float* rawf, float* raw, int64_t cd, int64_t key_dim, const float* fz, float* z, const float* fb,
                 const float* fa, float* ba, const int32_t* fh, int T, int64_t nk, int64_t nv, int64_t dv) override {
    use();
    cuda::dn_untile(rawf, raw, cd, key_dim, fz, z, fb, fa, ba, fh, T, nk, nv, dv, stream_);
  }
  void dn_retile(const float* y, float* out, const int32_t* fh, int T, int64_t nv, int64_t dv) override {
    use();
    cuda::dn_retile(y, out, fh, T, nv, dv, stream_);
  }
  void gated_norm_rows(const float* x, const float* w, const float* z, int64_t n, int heads, int T, float eps, bool sig,
                       float* y, ActKind feeds) override {
    use();
    const int64_t N = (int64_t)heads * n;
    void* qd = cuda::norm_quantizes(feeds, N) ? scratch(cuda::act_bytes(feeds, T, N)) : nullptr;
    if (qd && cuda::gated_norm_q(x, w, z, n, heads, T, eps, sig, y, stream_, feeds, qd)) {
      cache_q(feeds, y, N, T, N, qd);
      return;
    }
    Backend::gated_norm_rows(x, w, z, n, heads, T, eps, sig, y, feeds);
  }
  void gated_norm(const float* x, const float* w, const float* z, int64_t n, int rows, float eps, bool sig,
                  float* y) override {
    use();
    cuda::gated_norm(x, w, z, n, rows, eps, sig, y, stream_);
  }
  void mul_sigmoid_rows(float* o, int64_t ldo, const float* g, int64_t ldg, int64_t n, int rows) override {
    use();
    cuda::mul_sigmoid_rows(o, ldo, g, ldg, n, rows, stream_);
  }
  void silu_mul(float* g, const float* u, int64_t n) override {
    use_keep();
    written(g, n * sizeof(float));
    cuda::silu_mul(g, u, n, stream_);
  }
  void norm_rope(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps,
                 const float* cs, const float* sn, int64_t n_rot, int64_t pos0) override {
    use_keep();
    written(x, ((T - 1) * ldt + (nh - 1) * ldh + hd) * sizeof(float));
    cuda::norm_rope(x, ldt, ldh, T, nh, w, hd, eps, cs, sn, n_rot, pos0, stream_);
  }
  void moe_combine(const float* yg, const float* wt, int T, int k, int64_t H, const float* sh, const float* gate_shexp,
                   const float* x, float* out) override {
    use();
    STRATA_CHECK(stream_ == main_, "cuda backend: moe_combine inside a fork");
    const bool ready = sh && gate_ready_.gate == gate_shexp && gate_ready_.x == x && gate_ready_.T == T;
    gate_ready_ = {};
    if (sh && !ready) grow_aux(T);
    cuda::moe_combine(yg, wt, T, k, H, sh, gate_shexp, x, out, static_cast<float*>(aux_), stream_, ready);
  }
  void moe_shared_gate(const float* gate_shexp, const float* x, int T, int64_t H) override {
    use_keep();  // writes aux_ only
    grow_aux(T);
    cuda::shared_gate(gate_shexp, x, T, H, static_cast<float*>(aux_), stream_);
    gate_ready_ = {gate_shexp, x, T};
  }
  // aux_: the shared-expert gates of the rows (grown between operations, everything finished first)
  void grow_aux(int T) {
    if ((size_t)T * sizeof(float) <= aux_bytes_) return;
    STRATA_CHECK(!capturing_, "cuda backend: moe_combine's gates grow inside a recording");
    epoch_++;
    check(cudaDeviceSynchronize(), "device synchronize");
    if (aux_) cudaFree(aux_);
    aux_ = nullptr;
    aux_ = alloc((size_t)T * sizeof(float));
    aux_bytes_ = (size_t)T * sizeof(float);
  }
  void argmax_rows(const float* logits, int T, int64_t n_vocab, int32_t none, int32_t* out) override {
    if (T == 0) return;
    use();
    cuda::argmax_rows(logits, T, n_vocab, none, out, stream_);
  }
  bool can_embed(uint32_t type) const override { return cuda::embed_supported(type); }
  void embed_rows(const MatView& table, const int32_t* ids, int T, float* out) override {
    if (T == 0) return;
    use();
    cuda::embed_rows(table, ids, T, out, stream_);
  }
  // The CPU's checks first (the same errors), then the kernels; waits for the row status so that a row without a
  // finite logit raises pick_token's error, naming its position.
  void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                   int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out) override {
    STRATA_CHECK(T >= 0, "sample_rows: T must be >= 0, got ", T);
    if (T == 0) return;
    STRATA_CHECK(n_vocab > 0 && n_vocab <= INT32_MAX, "sample_rows: n_vocab must be in [1, 2^31), got ", n_vocab);
    STRATA_CHECK(logits != nullptr, "sample_rows: logits is null");
    STRATA_CHECK(inputs != nullptr && out != nullptr, "sample_rows: inputs/out is null");
    STRATA_CHECK(n_committed >= 0 && (n_committed == 0 || committed != nullptr),
                 "sample_rows: bad committed history (n_committed = ", n_committed, ")");
    p.validate();
    use();
    const size_t need = cuda::sample_scratch_bytes(T, n_vocab);
    char* base = static_cast<char*>(scratch(need + (size_t)T * sizeof(int32_t)));
    int32_t* status = reinterpret_cast<int32_t*>(base + need);
    cuda::sample_rows(logits, T, n_vocab, p, committed, n_committed, inputs, pos0, out, status, base, stream_);
    std::vector<int32_t> st((size_t)T);
    download(st.data(), status, (size_t)T * sizeof(int32_t));
    for (int i = 0; i < T; i++)
      if (st[i] != 0)
        fail("pick_token: no finite logit at position ", pos0 + i + 1, " (all ", n_vocab, " are NaN or -inf)");
  }

 private:
  // Grow-only device scratch (the quantized activation rows), one per lane (0: the main stream). Only grown
  // between operations: its stream is synchronized first, so no running kernel still reads the old buffer.
  void* scratch(size_t bytes) { return grow(scratch_[cur_], bytes); }
  // The lane's last quantized activation rows (in its scratch): their kind (256- or 32-value blocks), the float
  // rows they are of (x, ldx, rows, cols) and where they lie (qr: cuda::qrows_at of the scratch).
  struct QCache {
    ActKind kind = ActKind::Float;
    const float* x = nullptr;
    int64_t ldx = 0, rows = 0, cols = 0;
    cuda::QRows qr;
  };
  void cache_q(ActKind kind, const float* x, int64_t ldx, int64_t rows, int64_t cols, const void* base) {
    qc_[cur_] = QCache{kind, x, ldx, rows, cols, cuda::qrows_at(base, rows, cols)};
  }
  // Rows [r, r + rows) of a cached quantization of the same x, ldx, cols and kind: the lane's own, or in a fork
  // the main stream's (quantized before the fork; the main stream runs nothing until the join). whole: the
  // expert products, which write their tiles into this lane's scratch after their own rows' place
  // (matmul_sel_scratch_bytes): in this lane's scratch only a quantization of exactly those rows, never of more.
  bool q_hit(ActKind kind, const float* x, int64_t ldx, int64_t rows, int64_t cols, cuda::QRows& out,
             bool whole = false) const {
    for (int c : {cur_, 0}) {
      const QCache& q = qc_[c];
      if (!q.x || q.kind != kind || q.ldx != ldx || q.cols != cols) continue;
      const intptr_t d = reinterpret_cast<intptr_t>(x) - reinterpret_cast<intptr_t>(q.x);
      const intptr_t row = (intptr_t)ldx * (intptr_t)sizeof(float);
      if (d < 0 || d % row != 0 || d / row + rows > q.rows) continue;
      if (whole && c == cur_ && (d != 0 || rows != q.rows)) continue;
      const int64_t r = d / row, nb = cols / (kind == ActKind::Q8_32 ? 32 : QK_K);
      out = {q.qr.q + r * cols, q.qr.dx + r * nb};
      return true;
    }
    return false;
  }
  // An operation wrote `bytes` at p: a cached quantization of rows that overlap them is stale.
  void written(const void* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (auto& q : qc_) {
      if (!q.x) continue;
      const uintptr_t b = reinterpret_cast<uintptr_t>(q.x);
      const uintptr_t e = b + ((q.rows - 1) * q.ldx + q.cols) * sizeof(float);
      if (a < e && b < a + bytes) q = {};
    }
  }
  static constexpr int kLanes = 4;
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  void* grow(Scratch& sc, size_t bytes) {
    if (bytes > sc.bytes) {
      STRATA_CHECK(!capturing_, "cuda backend: scratch of ", bytes, " bytes needed inside a recording (run the step "
                   "once unrecorded first)");
      epoch_++;
      forget_q();
      check(cudaStreamSynchronize(stream_), "stream synchronize");
      if (sc.p) cudaFree(sc.p);
      sc.p = nullptr;
      sc.p = alloc(bytes);
      sc.bytes = bytes;
    }
    return sc.p;
  }
  int device_;
  std::string name_;
  cudaStream_t main_ = nullptr, stream_ = nullptr;  // stream_: the current lane's (main_ outside a fork)
  cudaStream_t lanes_[kLanes] = {};
  cudaStream_t copy_ = nullptr;  // upload_async's copies (expert streaming)
  cudaEvent_t copied_ = nullptr;
  std::vector<cudaEvent_t> marks_;  // mark_uploads' events on copy_, by mark number
  bool copies_ = false;          // copies issued since the last fence
  cudaEvent_t lane_done_[kLanes] = {}, forked_ev_ = nullptr;
  int n_forked_ = 0, cur_ = 0;
  Scratch scratch_[kLanes + 1];
  QCache qc_[kLanes + 1];
  void* aux_ = nullptr;
  size_t aux_bytes_ = 0;
  struct GateReady {  // moe_shared_gate's rows, waiting in aux_ for moe_combine
    const float* gate = nullptr;
    const float* x = nullptr;
    int T = 0;
  } gate_ready_;
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t epoch = 0;
  };
  std::vector<Graph> graphs_;
  bool capturing_ = false;
  uint64_t epoch_ = 0, capture_epoch_ = 0;
};

CudaBackend& as_cuda(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) fail<std::invalid_argument>("cuda timing: backend ", b.name(), " is not the CUDA backend");
  return *c;
}

__global__ void k_empty() {}

// Times `one(i)` for i in [0, per_pass) per pass, `reps` passes after a warm-up pass: per-call seconds.
template <class F>
CudaTiming time_passes(CudaBackend& c, int per_pass, int reps, F&& one) {
  STRATA_CHECK(per_pass >= 1 && reps >= 1, "cuda timing: per_pass = ", per_pass, ", reps = ", reps);
  c.use();
  for (int i = 0; i < per_pass; i++) one(i);
  c.sync();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> s;
  for (int r = 0; r < reps; r++) {
    check(cudaEventRecord(a, c.stream()), "cudaEventRecord");
    for (int i = 0; i < per_pass; i++) one(i);
    check(cudaEventRecord(b, c.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    s.push_back(ms * 1e-3 / per_pass);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(s.begin(), s.end());
  return {s[s.size() / 2], s[0]};
}

}  // namespace

bool cuda_available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

std::string cuda_info() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cat("no usable CUDA device: ", cudaGetErrorString(e));
  }
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::string out = cat("CUDA runtime ", rt / 1000, ".", rt % 1000 / 10, ", driver ", drv / 1000, ".", drv % 1000 / 10);
  for (int d = 0; d < n; d++) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    out += cat("\n", d, ": ", p.name, ", sm_", p.major, p.minor, ", ", p.multiProcessorCount, " SMs, ",
               p.totalGlobalMem >> 30, " GiB, L2 ", p.l2CacheSize >> 20, " MiB");
  }
  return out;
}

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

CudaTiming cuda_time_matmul(Backend& be, uint32_t type, int64_t rows, int64_t cols, const uint8_t* w, int nmat,
                            const float* x, int T, float* y, int reps) {
  CudaBackend& c = as_cuda(be);
  const size_t rb = row_bytes(type, cols);
  return time_passes(c, nmat, reps, [&](int i) {
    const MatView W{w + (size_t)i * rb * rows, type, rows, cols, rb};
    c.forget_q();  // each timed product quantizes its activation, as a lone product does
    c.matmul(W, x, cols, T, y, rows);
  });
}

CudaTiming cuda_time_calls(Backend& be, int per_pass, int reps, const std::function<void(int)>& one) {
  return time_passes(as_cuda(be), per_pass, reps, one);
}

void cuda_prefer_mma(bool on, int min_rows) { cuda::prefer_mma(on, min_rows); }
bool cuda_mma_used() { return cuda::mma_used(); }
void cuda_prefer_pdl(bool on, bool prefetch, bool windows) { cuda::prefer_pdl(on, prefetch, windows); }
bool cuda_pdl_used() { return cuda::pdl_on(); }
void cuda_prefer_norm_quant(bool on) { cuda::prefer_norm_quant(on); }
void cuda_prefer_iq2_rows(int dense, int sel, int pair) { cuda::prefer_iq2_rows(dense, sel, pair); }
void cuda_prefer_iq2_panel(bool on) { cuda::prefer_iq2_panel(on); }
void cuda_prefer_iq2_panel_staged(bool on) { cuda::prefer_iq2_panel_staged(on); }
void cuda_prefer_iq2_window_u4(bool on) { cuda::prefer_iq2_window_u4(on); }
void cuda_prefer_dn_duo(bool on) { cuda::prefer_dn_duo(on); }
void cuda_prefer_dn_conv_fused(bool on) { g_dn_conv_fused = on; }
void cuda_prefer_row_groups(bool on) { cuda::prefer_row_groups(on); }
void cuda_prefer_float_split(int64_t bytes) { cuda::prefer_float_split(bytes); }
void cuda_prefer_b32q_split(bool on) { cuda::prefer_b32q_split(on); }
void cuda_prefer_kq_lanes(bool on) { cuda::prefer_kq_lanes(on); }
void cuda_prefer_kq_pair(bool on) { cuda::prefer_kq_pair(on); }
void cuda_prefer_q5k_lanes(bool on) { cuda::prefer_q5k_lanes(on); }
void cuda_prefer_kquant_windows(bool on) { cuda::prefer_kquant_windows(on); }
void cuda_prefer_attn_tiles(bool on, int64_t min_queries) { cuda::prefer_attn_tiles(on, min_queries); }
void cuda_prefer_tile_prefetch(bool on) { cuda::prefer_tile_prefetch(on); }
void cuda_prefer_float_tiles(bool on, int min_rows, int64_t min_weight_rows) {
  cuda::prefer_float_tiles(on, min_rows, min_weight_rows);
}
void cuda_prefer_tile_stage(bool on) { cuda::prefer_tile_stage(on); }
void cuda_prefer_prompt_rows(int rows) {
  STRATA_CHECK(rows >= 1 && rows <= 4096, "cuda_prefer_prompt_rows: rows = ", rows, " (1..4096)");
  g_prompt_rows = rows;
}
int cuda_prompt_rows() { return g_prompt_rows; }

CudaTiming cuda_time_launch(Backend& be, int reps) {
  CudaBackend& c = as_cuda(be);
  return time_passes(c, 1000, reps, [&](int) {
    k_empty<<<1, 32, 0, c.stream()>>>();
    check(cudaGetLastError(), "launch of the empty kernel");
  });
}

CudaTiming cuda_time_copy(Backend& be, size_t bytes, int reps) {
  CudaBackend& c = as_cuda(be);
  void* a = c.alloc(bytes);
  void* b = c.alloc(bytes);
  check(cudaMemsetAsync(a, 1, bytes, c.stream()), "memset");
  CudaTiming t;
  try {
    t = time_passes(c, 4, reps, [&](int) { check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c.stream()), "copy"); });
  } catch (...) {
    c.release(a);
    c.release(b);
    throw;
  }
  c.release(a);
  c.release(b);
  return t;
}

}  // namespace strata
