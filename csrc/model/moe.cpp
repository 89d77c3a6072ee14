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

// One expert's SwiGLU over its gathered rows; the experts of a window run as one job list so the pool is
// woken twice per layer (gate+up, then down) instead of three times per expert.
struct ExpertJob {
  MatView gate, up, down;
  const float* x;  // [n][H] gathered rows
  int n;
  float* act;      // [n][F]
  float* out;      // [n][H]
};

// rows [r0, r1) of W for all n rows of x (passes of at most kMaxRowsPerPass)
void rows_all(const MatView& W, const float* x, int64_t ldx, int n, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  for (int t0 = 0; t0 < n; t0 += kMaxRowsPerPass) {
    const int tn = n - t0 < kMaxRowsPerPass ? n - t0 : kMaxRowsPerPass;
    matmul_range(W, x + t0 * ldx, ldx, tn, y + t0 * ldy, ldy, r0, r1);
  }
}

void run_experts(ThreadPool& pool, std::vector<ExpertJob>& jobs, int64_t H) {
  if (jobs.empty()) return;
  const int64_t F = jobs[0].gate.rows;
  // gate and up: global row g = job * 2F + (0..F-1 gate | F..2F-1 up)
  thread_local FBuf upbuf;
  int64_t total_act = 0;
  for (auto& j : jobs) total_act += (int64_t)j.n * F;
  upbuf.resize((size_t)total_act);
  std::vector<float*> ups(jobs.size());
  {
    float* p = upbuf.data();
    for (size_t i = 0; i < jobs.size(); i++) {
      ups[i] = p;
      p += (size_t)jobs[i].n * F;
    }
  }
  const int64_t per = 2 * F;
  pool.parallel_for((int64_t)jobs.size() * per, [&](int64_t b, int64_t e, int) {
    for (int64_t g = b; g < e;) {
      const int64_t j = g / per, r = g % per;
      const int64_t end = std::min(e, (j + 1) * per);
      const int64_t r_end = r + (end - g);
      ExpertJob& J = jobs[j];
      if (r < F) rows_all(J.gate, J.x, H, J.n, J.act, F, r, std::min(r_end, F));
      if (r_end > F) rows_all(J.up, J.x, H, J.n, ups[j], F, std::max(r, F) - F, r_end - F);
      g = end;
    }
  });
  for (size_t i = 0; i < jobs.size(); i++)
    for (int64_t k = 0; k < (int64_t)jobs[i].n * F; k++) jobs[i].act[k] = silu(jobs[i].act[k]) * ups[i][k];
  pool.parallel_for((int64_t)jobs.size() * H, [&](int64_t b, int64_t e, int) {
    for (int64_t g = b; g < e;) {
      const int64_t j = g / H, r = g % H;
      const int64_t end = std::min(e, (j + 1) * H);
      rows_all(jobs[j].down, jobs[j].act, F, jobs[j].n, jobs[j].out, H, r, r + (end - g));
      g = end;
    }
  });
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

  // experts: the union over rows, each expert run once over the rows that chose it (+ the shared expert
  // over all rows), as one job list
  const int64_t F = hp.n_ff_exp;
  slot_out.resize((size_t)T * k * H);
  xg.resize((size_t)T * k * H);
  yg.resize((size_t)T * k * F);
  std::vector<int32_t> order((size_t)T * k);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sel[a] < sel[b]; });
  std::vector<ExpertJob> jobs;
  std::vector<std::pair<size_t, int>> job_slots;  // (first index into order, n)
  for (size_t i = 0; i < order.size();) {
    const int32_t e = sel[order[i]];
    size_t j = i;
    for (; j < order.size() && sel[order[j]] == e; j++)
      std::memcpy(xg.data() + j * H, x + (size_t)(order[j] / k) * H, H * sizeof(float));
    jobs.push_back({w.gate_exps.expert(e), w.up_exps.expert(e), w.down_exps.expert(e), xg.data() + i * H, (int)(j - i),
                    yg.data() + i * F, nullptr});
    job_slots.push_back({i, (int)(j - i)});
    i = j;
  }
  thread_local FBuf ygather, sh_act;
  ygather.resize((size_t)T * k * H);
  for (size_t q = 0; q < jobs.size(); q++) jobs[q].out = ygather.data() + job_slots[q].first * H;
  if (w.has_shexp) {
    sh.resize((size_t)T * H);
    sh_act.resize((size_t)T * hp.n_ff_shexp);
    if (hp.n_ff_shexp == F) {
      jobs.push_back({w.gate_shexp, w.up_shexp, w.down_shexp, x, T, sh_act.data(), sh.data()});
    }
  }
  run_experts(pool, jobs, H);
  if (w.has_shexp && hp.n_ff_shexp != F) {
    std::vector<ExpertJob> sj{{w.gate_shexp, w.up_shexp, w.down_shexp, x, T, sh_act.data(), sh.data()}};
    run_experts(pool, sj, H);
  }
  for (size_t i = 0; i < order.size(); i++)
    std::memcpy(slot_out.data() + (size_t)order[i] * H, ygather.data() + i * H, H * sizeof(float));

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
