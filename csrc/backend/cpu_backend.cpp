// The CPU backend: host memory and today's kernels, unchanged (the model code still calls them directly; this
// is the same code behind the backend interface, so tests and benches can hold the CPU and the GPU side by side).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "kernels/rowops.h"
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
  void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y,
               int64_t ldy) override {
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
  void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                   int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out) override {
    strata::sample_rows(logits, T, n_vocab, p, committed, n_committed, inputs, pos0, out);
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
