// Sparse MoE (spec qwen3next.md 1.6): router softmax over all experts in fp32, top-k (ties: lower id),
// renormalise; SwiGLU experts; plus the sigmoid-gated shared expert. Each row's output is the sum of its
// own experts in rank order, so it never depends on which other rows share the window, nor on where an
// expert's bytes come from (the mapping, or an ExpertStream slot holding the same bytes) or in which
// batch it is computed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/rowops.h"
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
    silu_mul(jobs[i].act, ups[i], (int64_t)jobs[i].n * F);
  pool.parallel_for((int64_t)jobs.size() * H, [&](int64_t b, int64_t e, int) {
    for (int64_t g = b; g < e;) {
      const int64_t j = g / H, r = g % H;
      const int64_t end = std::min(e, (j + 1) * H);
      rows_all(jobs[j].down, jobs[j].act, F, jobs[j].n, jobs[j].out, H, r, r + (end - g));
      g = end;
    }
  });
}

// Cache-aware routing (MoCE, engine spec 6), APPROXIMATE: the natural top-`protect` stay; the other slots
// go to the largest p[e] * (resident[e] ? exp(bonus) : 1) among the rest; weights are the natural
// probabilities of the chosen experts, renormalised. Writes sel/wt for one row; returns how many of its
// choices differ from the natural top-k.
int route_moce(const float* p, const int32_t* natural, int64_t E, int64_t k, int protect, float bonus,
               const uint8_t* resident, int32_t* sel, float* wt) {
  thread_local std::vector<float> score;
  thread_local std::vector<int32_t> idx;
  score.resize(E);
  idx.resize(E);
  const float boost = std::exp(bonus);
  for (int64_t e = 0; e < E; e++) score[e] = resident[e] ? p[e] * boost : p[e];
  for (int j = 0; j < protect; j++) score[natural[j]] = INFINITY;  // kept, in natural order
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && (p[a] > p[b] || (p[a] == p[b] && a < b)));
  });
  float ws = 0.f;
  for (int64_t j = 0; j < k; j++) ws += p[idx[j]];
  int changed = 0;
  for (int64_t j = 0; j < k; j++) {
    sel[j] = idx[j];
    wt[j] = p[idx[j]] / ws;
    changed += std::find(natural, natural + k, idx[j]) == natural + k;
  }
  return changed;
}

}  // namespace

void moe_layer(const Model& m, const MoeWeights& w, const float* x, int T, float* out) {
  const HParams& hp = m.hp();
  const int64_t H = hp.n_embd, E = hp.n_expert, k = hp.n_expert_used;
  STRATA_CHECK(T >= 1 && (int64_t)w.gate_inp.size() == E * H, "moe: T = ", T, ", router has ", w.gate_inp.size(),
               " weights for ", E, " x ", H);
  ThreadPool& pool = m.pool();
  ExpertStream* es = m.experts();                 // null: every expert is in the mapping
  const int layer = es ? es->layer_of(&w) : -1;  // -1: not streamed (also the MTP block)
  thread_local FBuf logits, slot_out, xg, yg, sh;
  logits.resize((size_t)T * E);
  MatView router{reinterpret_cast<const uint8_t*>(w.gate_inp.data()), GGML_F32, E, H, (size_t)H * sizeof(float)};
  matmul(pool, router, x, H, T, logits.data(), E);  // [T][E]

  // routing per row (approximate routing reads the residency of this layer's experts once, before any row)
  const bool moce = layer >= 0 && es->options().approximate;
  std::vector<uint8_t> resident;
  if (moce) {
    resident.resize(E);
    es->cache().resident_mask(es->key(layer, 0), (int)E, resident.data());
  }
  uint64_t moce_changed = 0;
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
    if (moce) {
      const ExpertOptions& o = es->options();
      moce_changed += route_moce(l, idx.data(), E, k, t == 0 ? o.protect : o.draft_protect,
                                 t == 0 ? o.bonus : o.draft_bonus, resident.data(), &sel[t * k], &wt[t * k]);
      continue;
    }
    float ws = 0.f;
    for (int64_t j = 0; j < k; j++) ws += l[idx[j]];
    for (int64_t j = 0; j < k; j++) {
      sel[t * k + j] = idx[j];
      wt[t * k + j] = l[idx[j]] / ws;
    }
  }
  if (moce) es->note_moce(moce_changed, (uint64_t)T);

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
  std::vector<int32_t> uni;                       // the union, ascending; jobs[q] runs expert uni[q]
  std::vector<std::pair<size_t, int>> job_slots;  // (first index into order, n)
  for (size_t i = 0; i < order.size();) {
    const int32_t e = sel[order[i]];
    size_t j = i;
    for (; j < order.size() && sel[order[j]] == e; j++)
      std::memcpy(xg.data() + j * H, x + (size_t)(order[j] / k) * H, H * sizeof(float));
    jobs.push_back({{}, {}, {}, xg.data() + i * H, (int)(j - i), yg.data() + i * F, nullptr});
    uni.push_back(e);
    job_slots.push_back({i, (int)(j - i)});
    i = j;
  }
  thread_local FBuf ygather, sh_act;
  ygather.resize((size_t)T * k * H);
  for (size_t q = 0; q < jobs.size(); q++) jobs[q].out = ygather.data() + job_slots[q].first * H;
  std::vector<ExpertJob> shared;  // the shared expert joins the first batch when its shape matches
  if (w.has_shexp) {
    sh.resize((size_t)T * H);
    sh_act.resize((size_t)T * hp.n_ff_shexp);
    shared.push_back({w.gate_shexp, w.up_shexp, w.down_shexp, x, T, sh_act.data(), sh.data()});
  }
  const bool shared_joins = w.has_shexp && hp.n_ff_shexp == F;
  if (layer < 0) {
    for (size_t q = 0; q < jobs.size(); q++) {
      jobs[q].gate = w.gate_exps.expert(uni[q]);
      jobs[q].up = w.up_exps.expert(uni[q]);
      jobs[q].down = w.down_exps.expert(uni[q]);
    }
    if (shared_joins) jobs.push_back(shared[0]);
    run_experts(pool, jobs, H);
    if (w.has_shexp && !shared_joins) run_experts(pool, shared, H);
  } else {
    // streamed (expert_stream.h): pin the union, compute the shared and resident experts while the missing
    // ones are read, then each batch that has arrived; a union larger than the cache goes in groups
    const int U = (int)uni.size(), cap = es->cache().slots();
    const int groups = (U + cap - 1) / cap;
    es->note_union(U, groups);
    es->score_prediction(layer, uni);
    for (int g0 = 0; g0 < U; g0 += cap) {
      const int g1 = std::min(U, g0 + cap);
      ExpertStream::Pins pins(*es, layer, uni.data() + g0, g1 - g0);
      if (groups == 1) es->prefetch(pool, layer, x, T);
      std::vector<ExpertJob> batch;
      auto add = [&](int i) {
        ExpertJob& J = jobs[g0 + i];
        es->views(layer, uni[g0 + i], pins.slot(i), &J.gate, &J.up, &J.down);
        batch.push_back(J);
      };
      for (int i = 0; i < g1 - g0; i++)
        if (pins.ready(i)) add(i);
      if (g0 == 0 && w.has_shexp) {
        if (shared_joins) batch.push_back(shared[0]);
        else run_experts(pool, shared, H);
      }
      run_experts(pool, batch, H);
      while (pins.pending()) {
        batch.clear();
        for (int i : pins.wait()) add(i);
        run_experts(pool, batch, H);
      }
    }
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
