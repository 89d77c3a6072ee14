// The CPU backend: host memory and today's kernels, unchanged (the native model code still calls them directly;
// this is the same code behind the backend interface, so the backend forward (model/backend_forward.cpp) and the
// tests and benches can hold the CPU and the GPU side by side). Every layer operation calls exactly the code the
// CPU model uses (ops.h, rowops.h, deltanet_state.h).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include <cmath>

#include "backend/backend.h"
#include "kernels/rowops.h"
#include "kernels/types.h"
#include "model/ops.h"
#include "util/common.h"
#include "util/threads.h"

namespace strata {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}
  std::string name() const override { return "cpu"; }

  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) fail<std::runtime_error>("cpu backend: cannot allocate ", bytes, " bytes");
    return p;
  }
  void release(void* p) override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void sync() override {}

  void matmul(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy) override {
    strata::matmul(pool_, W, x, ldx, T, y, ldy);
  }
  void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y, int64_t ldy,
               ActKind) override {  // the products quantize their own rows
    for (int t = 0; t < T; t++) strata::rmsnorm(x + t * ldx, w, n, eps, y + t * ldy);
  }
  void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) override {
    strata::dn_rows(S, S_work, rows, T, n_src, dk, dv);
  }
  void attend(const AttendArgs& a) override {
    std::vector<float> scratch((size_t)attend_scratch(a));
    strata::attend(a, scratch.data());
  }
  void moe_route(const float* logits, int T, int64_t E, int k, int32_t* sel, float* wt) override {
    STRATA_CHECK(k >= 1 && k <= E, "moe_route: k = ", k, " for ", E, " experts");
    std::vector<float> p((size_t)E);
    std::vector<int32_t> idx((size_t)E);
    for (int t = 0; t < T; t++) {
      route_row(logits + (size_t)t * E, E, k, p.data(), idx.data());
      for (int j = 0; j < k; j++) sel[t * k + j] = idx[j];
      float ws = 0.f;
      for (int j = 0; j < k; j++) ws += p[idx[j]];
      for (int j = 0; j < k; j++) wt[t * k + j] = p[idx[j]] / ws;
    }
  }
  void matmul_sel(const MatView& W0, size_t expert_bytes, const int32_t* sel, int n, int xdiv, const float* x,
                  int64_t ldx, float* y, int64_t ldy) override {
    for (int s = 0; s < n; s++) {
      MatView W = W0;
      W.data = W0.data + (size_t)sel[s] * expert_bytes;
      strata::matmul(pool_, W, x + (int64_t)(s / xdiv) * ldx, ldx, 1, y + (int64_t)s * ldy, ldy);
    }
  }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void add(float* x, const float* y, int64_t n) override {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
  }
  void conv_silu(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out) override {
    causal_conv_silu(hist, w_t, T, n, ld, K, out);
  }
  void dn_gates(float* conv, int64_t ld, const float* ba, const float* ssm_a, const float* dt_bias, int T, int64_t nk,
                int64_t nv, int64_t dk, float* eg, float* beta) override {
    const int64_t r = nv / nk, key_dim = nk * dk;
    const float qscale = 1.f / std::sqrt((float)dk);
    for (int t = 0; t < T; t++)
      for (int64_t g = 0; g < nk; g++) {  // deltanet.cpp's per-row loop of one key head
        float* row = conv + (size_t)t * ld;
        float* q = row + g * dk;
        l2norm(q, dk, 1e-6f);
        for (int64_t i = 0; i < dk; i++) q[i] = q[i] * qscale;
        l2norm(row + key_dim + g * dk, dk, 1e-6f);
        for (int64_t j = 0; j < r; j++) {
          const int64_t h = g * r + j;
          const float b = ba[(size_t)t * 2 * nv + g * 2 * r + j];
          const float a = ba[(size_t)t * 2 * nv + g * 2 * r + r + j];
          beta[t * nv + h] = sigmoid(b);
          const float lg = ssm_a[h] * softplus(a + dt_bias[h]);
          eg[t * nv + h] = std::exp(lg);
        }
      }
  }
  void dn_heads(float* S, float* S_work, const DnHeads& a, int T, int n_src) override {
    const int64_t r = a.nv / a.nk, hs = a.dk * a.dv;
    pool_.parallel_for(a.nv, [&](int64_t hb, int64_t he, int) {
      std::vector<DnRow> rows((size_t)T);
      for (int64_t h = hb; h < he; h++) {
        const int64_t g = h / r;
        for (int t = 0; t < T; t++)
          rows[t] = {a.k + t * a.ldk + g * a.dk, a.v + t * a.ldv + h * a.dv, a.q ? a.q + t * a.ldq + g * a.dk : nullptr,
                     a.eg[t * a.nv + h], a.beta[t * a.nv + h], a.o ? a.o + t * a.ldo + h * a.dv : nullptr};
        strata::dn_rows(S + h * hs, S_work ? S_work + h * hs : nullptr, rows.data(), T, n_src, a.dk, a.dv);
      }
    }, 1, T);
  }
  void dn_untile(const float* rawf, float* raw, int64_t cd, int64_t key_dim, const float* fz, float* z, const float* fb,
                 const float* fa, float* ba, const int32_t* fh, int T, int64_t nk, int64_t nv, int64_t dv) override {
    const int64_t r = nv / nk, d_inner = nv * dv;
    for (int t = 0; t < T; t++) {
      const float* src = rawf + (size_t)t * cd;
      float* dst = raw + (size_t)t * cd;
      std::memcpy(dst, src, (size_t)2 * key_dim * sizeof(float));
      for (int64_t j = 0; j < nv; j++) {
        const int64_t sl = fh[j];
        std::memcpy(dst + 2 * key_dim + j * dv, src + 2 * key_dim + sl * dv, dv * sizeof(float));
        std::memcpy(z + (size_t)t * d_inner + j * dv, fz + (size_t)t * d_inner + sl * dv, dv * sizeof(float));
        ba[(size_t)t * 2 * nv + (j / r) * 2 * r + j % r] = fb[(size_t)t * nv + sl];
        ba[(size_t)t * 2 * nv + (j / r) * 2 * r + r + j % r] = fa[(size_t)t * nv + sl];
      }
    }
  }
  void dn_retile(const float* y, float* out, const int32_t* fh, int T, int64_t nv, int64_t dv) override {
    for (int t = 0; t < T; t++)
      for (int64_t j = 0; j < nv; j++)
        std::memcpy(out + (size_t)t * nv * dv + fh[j] * dv, y + (size_t)t * nv * dv + j * dv, dv * sizeof(float));
  }
  void gated_norm(const float* x, const float* w, const float* z, int64_t n, int rows, float eps, bool sig,
                  float* y) override {
    for (int i = 0; i < rows; i++) {
      strata::rmsnorm(x + (size_t)i * n, w, n, eps, y + (size_t)i * n);
      if (sig) mul_sigmoid(y + (size_t)i * n, z + (size_t)i * n, n);
      else mul_silu(y + (size_t)i * n, z + (size_t)i * n, n);
    }
  }
  void mul_sigmoid_rows(float* o, int64_t ldo, const float* g, int64_t ldg, int64_t n, int rows) override {
    for (int i = 0; i < rows; i++) mul_sigmoid(o + i * ldo, g + i * ldg, n);
  }
  void silu_mul(float* g, const float* u, int64_t n) override { strata::silu_mul(g, u, n); }
  void norm_rope(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps,
                 const float* cs, const float* sn, int64_t n_rot, int64_t pos0) override {
    for (int t = 0; t < T; t++)
      for (int h = 0; h < nh; h++) {
        float* v = x + t * ldt + h * ldh;
        strata::rmsnorm(v, w, hd, eps, v);
        rope_neox(v, n_rot, cs + (pos0 + t) * (n_rot / 2), sn + (pos0 + t) * (n_rot / 2));
      }
  }
  void moe_combine(const float* yg, const float* wt, int T, int k, int64_t H, const float* sh, const float* gate_shexp,
                   const float* x, float* out) override {
    for (int t = 0; t < T; t++) {  // moe.cpp's last loop
      float* o = out + (size_t)t * H;
      for (int64_t i = 0; i < H; i++) o[i] = 0.f;
      for (int j = 0; j < k; j++) axpy(o, yg + (size_t)(t * k + j) * H, wt[t * k + j], H);
      if (sh) {
        float gl = 0.f;
        const float* xt = x + (size_t)t * H;
        for (int64_t i = 0; i < H; i++) gl += gate_shexp[i] * xt[i];
        axpy(o, sh + (size_t)t * H, sigmoid(gl), H);
      }
    }
  }
  void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                   int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out) override {
    strata::sample_rows(logits, T, n_vocab, p, committed, n_committed, inputs, pos0, out);
  }
  void argmax_rows(const float* logits, int T, int64_t n_vocab, int32_t none, int32_t* out) override {
    for (int t = 0; t < T; t++) {
      const int32_t b = argmax(logits + (size_t)t * n_vocab, n_vocab);
      out[t] = b < 0 ? none : b;
    }
  }
  bool can_embed(uint32_t type) const override { return type_traits(type) && type_traits(type)->dequant; }
  void embed_rows(const MatView& table, const int32_t* ids, int T, float* out) override {
    STRATA_CHECK(can_embed(table.type), "embed_rows: no dequantizer for type ", type_name(table.type));
    const TypeTraits* tt = type_traits(table.type);
    for (int t = 0; t < T; t++) {
      STRATA_CHECK(ids[t] >= 0 && ids[t] < table.rows, "embed_rows: token id ", ids[t], " outside [0, ", table.rows, ")");
      tt->dequant(table.data + (size_t)ids[t] * table.row_bytes, out + (size_t)t * table.cols, table.cols);
    }
  }

 private:
  // moe.cpp's routing of one row: p = softmax(l), idx[0..k) the top k (ties: lower id).
  static void route_row(const float* l, int64_t E, int k, float* p, int32_t* idx) {
    float mx = l[0];
    for (int64_t e = 1; e < E; e++) mx = std::max(mx, l[e]);
    std::copy(l, l + E, p);
    exp_shift(p, mx, E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; e++) sum += p[e];
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / sum;
    std::iota(idx, idx + E, 0);
    std::partial_sort(idx, idx + k, idx + E, [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  }
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace strata
