// Sparse MoE (spec qwen3next.md 1.6): router softmax over all experts in fp32, top-k (ties: lower id),
// renormalise; SwiGLU experts; plus the sigmoid-gated shared expert. Each row's output is the sum of its
// own experts in rank order, so it never depends on which other rows share the window.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "model/layers.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

namespace {

// SwiGLU expert over n gathered rows: out[n][H] = down(silu(gate x) * up x)
void swiglu(ThreadPool& pool, const MatView& gate, const MatView& up, const MatView& down, const float* x, int n,
            int64_t H, float* out) {
  const int64_t F = gate.rows;
  thread_local FBuf g, u;
  g.resize((size_t)n * F);
  u.resize((size_t)n * F);
  matmul(pool, gate, x, H, n, g.data(), F);
  matmul(pool, up, x, H, n, u.data(), F);
  for (int64_t i = 0; i < (int64_t)n * F; i++) g[i] = silu(g[i]) * u[i];
  matmul(pool, down, g.data(), F, n, out, H);
}

}  // namespace

void moe_layer(const Model& m, const MoeWeights& w, const float* x, int T, float* out) {
  const HParams& hp = m.hp();
  const int64_t H = hp.n_embd, E = hp.n_expert, k = hp.n_expert_used;
  ThreadPool& pool = m.pool();
  thread_local FBuf logits, slot_out, xg, yg, sh;
  logits.resize((size_t)T * E);
  MatView router{reinterpret_cast<const uint8_t*>(w.gate_inp.data()), GGML_F32, E, H, (size_t)H * sizeof(float)};
  matmul(pool, router, x, H, T, logits.data(), E);

  // routing per row
  std::vector<int32_t> sel((size_t)T * k);
  std::vector<float> wt((size_t)T * k);
  std::vector<int32_t> idx(E);
  for (int t = 0; t < T; t++) {
    float* l = logits.data() + (size_t)t * E;
    float mx = l[0];
    for (int64_t e = 1; e < E; e++) mx = std::max(mx, l[e]);
    float sum = 0.f;
    for (int64_t e = 0; e < E; e++) {
      l[e] = std::exp(l[e] - mx);
      sum += l[e];
    }
    for (int64_t e = 0; e < E; e++) l[e] = l[e] / sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    float ws = 0.f;
    for (int64_t j = 0; j < k; j++) ws += l[idx[j]];
    for (int64_t j = 0; j < k; j++) {
      sel[t * k + j] = idx[j];
      wt[t * k + j] = l[idx[j]] / ws;
    }
  }

  // experts: the union over rows, each expert run once over the rows that chose it
  slot_out.resize((size_t)T * k * H);
  xg.resize((size_t)T * H);
  yg.resize((size_t)T * H);
  std::vector<int32_t> order((size_t)T * k);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sel[a] < sel[b]; });
  for (size_t i = 0; i < order.size();) {
    const int32_t e = sel[order[i]];
    size_t j = i;
    int n = 0;
    for (; j < order.size() && sel[order[j]] == e; j++, n++)
      std::memcpy(xg.data() + (size_t)n * H, x + (size_t)(order[j] / k) * H, H * sizeof(float));
    swiglu(pool, w.gate_exps.expert(e), w.up_exps.expert(e), w.down_exps.expert(e), xg.data(), n, H, yg.data());
    for (int q = 0; q < n; q++)
      std::memcpy(slot_out.data() + (size_t)order[i + q] * H, yg.data() + (size_t)q * H, H * sizeof(float));
    i = j;
  }

  if (w.has_shexp) {
    sh.resize((size_t)T * H);
    swiglu(pool, w.gate_shexp, w.up_shexp, w.down_shexp, x, T, H, sh.data());
  }
  for (int t = 0; t < T; t++) {
    float* o = out + (size_t)t * H;
    for (int64_t i = 0; i < H; i++) o[i] = 0.f;
    for (int64_t j = 0; j < k; j++) {
      const float* so = slot_out.data() + ((size_t)t * k + j) * H;
      const float wj = wt[t * k + j];
      for (int64_t i = 0; i < H; i++) o[i] += so[i] * wj;
    }
    if (w.has_shexp) {
      float gl = 0.f;
      const float* xt = x + (size_t)t * H;
      for (int64_t i = 0; i < H; i++) gl += w.gate_inp_shexp[i] * xt[i];
      const float gs = sigmoid(gl);
      const float* st = sh.data() + (size_t)t * H;
      for (int64_t i = 0; i < H; i++) o[i] += gs * st[i];
    }
  }
}

}  // namespace strata
