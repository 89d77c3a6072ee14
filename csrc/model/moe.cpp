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

// One expert's SwiGLU over its rows (the routed experts' gathered rows, or every row for the shared expert).
struct ExpertJob {
  MatView gate, up, down;
  const float* x;  // [n][H]; with rows, every row of the layer's input and the job's are x[rows[i]]
  int n;
  const int32_t* rows = nullptr;  // (routed experts of several rows) gathered when the job is prepared
  float* act;      // [n][F], F = gate.rows
  float* out;      // [n][H]
  bool split = false;  // rows divided among the threads (the shared expert); else the job goes to one thread
};

// x's n rows prepared for W (quantized once when W's type needs it); `same` is reused when it was prepared
// for a type of the same activation kind
const ActRows& prepared(ActRows& buf, const MatView& W, const float* x, int64_t ldx, int n, const ActRows* same,
                        uint32_t same_type) {
  if (same && act_kind(same_type) == act_kind(W.type)) return *same;
  buf.prepare(W.type, x, ldx, n, W.cols);
  return buf;
}

// Every job's SwiGLU in two parallel regions:
//   (1) for each of a job's F rows r: gate row r and up row r, then silu(gate) * up on the act column r;
//   (2) the down projection.
// Jobs marked `split` (the shared expert: all T rows) are divided row-wise among the threads; the others
// (routed experts, one or a few rows each) go whole to one thread, in contiguous runs of about equal cost
// (a job of n rows ~ 3 + n: its decode, then n multiply-adds per weight). So both cores stream expert bytes
// and both do the shared expert's arithmetic: a split by whole jobs alone leaves one core with the
// memory-bound experts, and splitting every job costs twice the kernel calls.
void run_experts(ThreadPool& pool, std::vector<ExpertJob>& jobs, int64_t H) {
  if (jobs.empty()) return;
  // thread_local buffers are per thread: the workers get references to the calling thread's
  thread_local FBuf upbuf_tl;
  thread_local std::vector<float*> ups_tl;
  thread_local std::vector<size_t> owner_tl;  // owner_tl[p] .. owner_tl[p+1]: the whole jobs of thread p
  FBuf& upbuf = upbuf_tl;
  std::vector<float*>& ups = ups_tl;
  std::vector<size_t>& owner = owner_tl;
  int64_t total_act = 0;
  for (auto& j : jobs) total_act += (int64_t)j.n * j.gate.rows;
  upbuf.resize((size_t)total_act);
  ups.resize(jobs.size());
  for (size_t q = 0, o = 0; q < jobs.size(); o += (size_t)jobs[q].n * jobs[q].gate.rows, q++) ups[q] = upbuf.data() + o;
  const int parts = pool.size();
  double total = 0;
  for (auto& j : jobs) total += j.split ? 0 : 3 + j.n;
  owner.assign(parts + 1, jobs.size());
  owner[0] = 0;
  double acc = 0;
  for (size_t q = 0, p = 1; q < jobs.size() && p < (size_t)parts; q++) {
    if (jobs[q].split) continue;
    const double c = 3 + jobs[q].n;
    while (p < (size_t)parts && acc + c / 2 >= total * p / parts) owner[p++] = q;
    acc += c;
  }
  // Activation rows are prepared once per job and matrix kind: by the thread that runs a whole job, and for
  // the split jobs before each region (every piece reads them).
  thread_local ActRows split_x_tl, split_x2_tl, split_act_tl;  // the caller's: workers get pointers
  ActRows &split_x = split_x_tl, &split_x2 = split_x2_tl, &split_act = split_act_tl;
  const ExpertJob* sj = nullptr;
  for (auto& j : jobs)
    if (j.split) sj = &j;  // at most one: the shared expert
  const ActRows *sx = nullptr, *sx2 = nullptr;
  if (sj) {
    sx = &prepared(split_x, sj->gate, sj->x, H, sj->n, nullptr, 0);
    sx2 = &prepared(split_x2, sj->up, sj->x, H, sj->n, sx, sj->gate.type);
  }
  auto gate_up = [&](size_t q, int64_t r0, int64_t r1) {
    const ExpertJob& J = jobs[q];
    const int64_t F = J.gate.rows;
    thread_local ActRows ax, ax2;
    // a routed job's rows copied together here, by the thread that runs it (a few rows: they stay in its cache
    // for the quantization), not all T k slots' rows into one buffer of T k H floats first (a 512-row window of
    // the 80B: 42 MB a layer). The same rows, so the same bits; no speed change measured on a 480 MB-L3 Xeon
    // (docs/BENCHMARKS.md session 33)
    thread_local FBuf stage;
    const float* xj = J.x;
    if (J.rows) {
      stage.resize((size_t)J.n * H);
      for (int t = 0; t < J.n; t++)
        std::memcpy(stage.data() + (size_t)t * H, J.x + (size_t)J.rows[t] * H, H * sizeof(float));
      xj = stage.data();
    }
    const ActRows& a = J.split ? *sx : prepared(ax, J.gate, xj, H, J.n, nullptr, 0);
    const ActRows& a2 = J.split ? *sx2 : prepared(ax2, J.up, xj, H, J.n, &a, J.gate.type);
    matmul_rows(J.gate, a, J.act, F, r0, r1);
    matmul_rows(J.up, a2, ups[q], F, r0, r1);
    for (int t = 0; t < J.n; t++) silu_mul(J.act + t * F + r0, ups[q] + t * F + r0, r1 - r0);
  };
  auto down = [&](size_t q, int64_t r0, int64_t r1) {
    const ExpertJob& J = jobs[q];
    thread_local ActRows ad;
    const ActRows& a = J.split ? split_act : prepared(ad, J.down, J.act, J.gate.rows, J.n, nullptr, 0);
    matmul_rows(J.down, a, J.out, H, r0, r1);
  };
  int64_t routed = 0;  // rows over all jobs: tells a decode step's regions from a prompt window's (the pool's tag)
  for (auto& j : jobs) routed += j.n;
  auto region = [&](auto&& fn, bool is_down) {
    pool.parallel_for(parts, [&](int64_t pb, int64_t pe, int) {
      for (int64_t p = pb; p < pe; p++)
        for (size_t q = 0; q < jobs.size(); q++) {
          const int64_t R = is_down ? H : jobs[q].gate.rows;
          if (jobs[q].split) {
            int64_t r0, r1;
            ThreadPool::chunk(R, parts, (int)p, &r0, &r1);
            if (r0 < r1) fn(q, r0, r1);
          } else if (q >= owner[p] && q < owner[p + 1]) {
            fn(q, 0, R);
          }
        }
    }, 1, routed);
  };
  region(gate_up, false);
  if (sj) split_act.prepare(sj->down.type, sj->act, sj->gate.rows, sj->n, sj->down.cols);
  region(down, true);
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
  thread_local FBuf logits, yg, sh;
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
  thread_local std::vector<int32_t> sel, idx;
  thread_local FBuf wt;
  sel.resize((size_t)T * k);
  wt.resize((size_t)T * k);
  idx.resize(E);
  for (int t = 0; t < T; t++) {
    float* l = logits.data() + (size_t)t * E;
    float mx = l[0];
    for (int64_t e = 1; e < E; e++) mx = std::max(mx, l[e]);
    exp_shift(l, mx, E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; e++) sum += l[e];
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
  // over all rows), as one job list. The slots (row t, rank j) = t * k + j sorted by expert, stably (a
  // counting sort); a job with several rows gathers them when it runs (ExpertJob::rows), a job with one reads it
  // in place; each job's outputs land contiguously in ygather, slot i's at row pos[i].
  const int64_t F = hp.n_ff_exp, S = (int64_t)T * k;
  thread_local std::vector<int32_t> order, pos, first, src;
  order.resize(S);
  pos.resize(S);
  src.resize(S);
  first.assign(E + 1, 0);
  for (int64_t i = 0; i < S; i++) first[sel[i] + 1]++;
  for (int64_t e = 0; e < E; e++) first[e + 1] += first[e];
  for (int64_t i = 0; i < S; i++) {
    pos[i] = first[sel[i]]++;
    order[pos[i]] = (int32_t)i;
  }
  for (int64_t i = 0; i < S; i++) src[i] = (int32_t)(order[i] / k);  // sorted slot i's input row
  thread_local FBuf ygather, sh_act;
  yg.resize((size_t)S * F);
  ygather.resize((size_t)S * H);
  thread_local std::vector<ExpertJob> jobs;
  thread_local std::vector<int32_t> uni;  // the union, ascending; jobs[q] runs expert uni[q]
  jobs.clear();
  uni.clear();
  for (int64_t i = 0; i < S;) {
    const int32_t e = sel[order[i]];
    int64_t j = i + 1;
    while (j < S && sel[order[j]] == e) j++;
    const bool one = j - i == 1;
    jobs.push_back({{}, {}, {}, one ? x + (size_t)src[i] * H : x, (int)(j - i), one ? nullptr : src.data() + i,
                    yg.data() + i * F, ygather.data() + i * H});
    uni.push_back(e);
    i = j;
  }
  // A prompt window's combine below is a memory-bound loop over megabytes: split over the pool (each row is one
  // fixed sequence of axpy, whoever runs it). Decode steps and verify windows keep it on the caller: another
  // region a layer would cost more than it saves.
  const bool wide = T >= 64;
  auto rows = [&](int64_t n, auto&& fn) {
    if (wide) pool.parallel_for(n, [&](int64_t b, int64_t e, int) { for (int64_t r = b; r < e; r++) fn(r); });
    else for (int64_t r = 0; r < n; r++) fn(r);
  };
  ExpertJob shared{};  // the shared expert (all T rows) joins the first batch
  if (w.has_shexp) {
    sh.resize((size_t)T * H);
    sh_act.resize((size_t)T * hp.n_ff_shexp);
    shared = {w.gate_shexp, w.up_shexp, w.down_shexp, x, T, nullptr, sh_act.data(), sh.data(), true};
  }
  if (layer < 0) {
    for (size_t q = 0; q < jobs.size(); q++) {
      jobs[q].gate = w.gate_exps.expert(uni[q]);
      jobs[q].up = w.up_exps.expert(uni[q]);
      jobs[q].down = w.down_exps.expert(uni[q]);
    }
    if (w.has_shexp) jobs.push_back(shared);
    run_experts(pool, jobs, H);
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
      thread_local std::vector<ExpertJob> batch;
      batch.clear();
      auto add = [&](int i) {
        ExpertJob& J = jobs[g0 + i];
        es->views(layer, uni[g0 + i], pins.slot(i), &J.gate, &J.up, &J.down);
        batch.push_back(J);
      };
      for (int i = 0; i < g1 - g0; i++)
        if (pins.ready(i)) add(i);
      if (g0 == 0 && w.has_shexp) batch.push_back(shared);
      run_experts(pool, batch, H);
      while (pins.pending()) {
        batch.clear();
        for (int i : pins.wait()) add(i);
        run_experts(pool, batch, H);
      }
    }
  }
  // (the buffers are the caller's thread_locals: the workers get plain pointers)
  const float* const ygp = ygather.data();
  const float* const shp = w.has_shexp ? sh.data() : nullptr;
  const int32_t* const posp = pos.data();
  const float* const wtp = wt.data();
  rows(T, [&](int64_t t) {
    float* o = out + (size_t)t * H;
    for (int64_t i = 0; i < H; i++) o[i] = 0.f;
    for (int64_t j = 0; j < k; j++) axpy(o, ygp + (size_t)posp[t * k + j] * H, wtp[t * k + j], H);
    if (shp) {
      float gl = 0.f;
      const float* xt = x + (size_t)t * H;
      for (int64_t i = 0; i < H; i++) gl += w.gate_inp_shexp[i] * xt[i];
      axpy(o, shp + (size_t)t * H, sigmoid(gl), H);
    }
  });
}

}  // namespace strata
