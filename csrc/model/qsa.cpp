// QSA, Qwen Sparse Attention (qwen4exp.md 1.5): gated attention where each query attends only to the
// r-token blocks its indexer selects, plus its incomplete tail block. Per row at position p:
//   q_idx   = RoPE_p(rmsnorm(indexer.q_proj x; q_norm))         [ni][di]   (the main rotary dims)
//   raw_p   = indexer.k_proj x                                  [di]       cached raw (no norm, no RoPE)
//   pooled_b = RoPE_{b*r}(rmsnorm(mean(raw_{b*r} .. raw_{b*r+r-1}); k_norm))   for each complete block b
//   s_b     = sum_h relu(q_idx_h . pooled_b) / sqrt(di)
//   n_c = (p+1) / r complete blocks: n_c <= budget/r -> dense causal attention over 0..p; else the
//   budget/r blocks of largest s_b (ties: the lower block index, a fixed rule since torch.topk has none)
//   plus the tail n_c*r .. p. A block is a candidate from the query that completes it, so that query
//   attends to its own token only if its block wins.
// Selection, scores and attention of a row depend only on the row's inputs and cells <= p, so a window
// row computes exactly what serial decoding does (state/qsa_state.h for the rollback contract).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/attend.h"
#include "kernels/rowops.h"
#include "model/attention.h"
#include "model/layers.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

// The blocks kept for a sparse query: the kb best scores, ties to the lower index (NaN ranks last); ascending.
void qsa_select_blocks(const float* s, int64_t n_c, int64_t kb, std::vector<int32_t>& out) {
  STRATA_CHECK(kb >= 1 && kb <= n_c, "qsa: selecting ", kb, " of ", n_c, " blocks");
  out.resize((size_t)n_c);
  std::iota(out.begin(), out.end(), 0);
  auto score = [&](int32_t b) { return std::isnan(s[b]) ? -INFINITY : s[b]; };
  auto better = [&](int32_t a, int32_t b) { return score(a) > score(b) || (score(a) == score(b) && a < b); };
  std::nth_element(out.begin(), out.begin() + (kb - 1), out.end(), better);
  out.resize((size_t)kb);
  std::sort(out.begin(), out.end());
}

void qsa_layer(const Model& m, const AttnWeights& w, KvCache& kv, QsaState& qs, const float* x, int T, int64_t pos0,
               float* out) {
  const HParams& hp = m.hp();
  const int64_t hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, group = nh / nkv;
  const int64_t ni = hp.qsa.n_head, di = hp.qsa.head_dim, r = hp.qsa.ratio, kb = hp.qsa.blocks();
  STRATA_CHECK(w.qsa && qs.active() && qs.dim == di && qs.ratio == r, "qsa: the layer's indexer state does not fit");
  STRATA_CHECK(pos0 + T <= qs.n_ctx, "qsa: positions ", pos0, "..", pos0 + T - 1, " exceed the context ", qs.n_ctx);
  thread_local FBuf qg, att, qi, kr, sc;
  qg.resize((size_t)T * nh * hd * 2);  // [T][nh][q(hd) | gate(hd)]
  att.resize((size_t)T * nh * hd);     // [T][nh][hd]
  qi.resize((size_t)T * ni * di);      // [T][ni][di] indexer queries
  kr.resize((size_t)T * di);           // [T][di] raw index keys
  const MatOut idx[2] = {{&w.idx.wq, qi.data(), ni * di}, {&w.idx.wk, kr.data(), di}};
  attn_project(m, w, kv, x, T, pos0, qg.data(), idx, 2);

  // indexer rows: q normed and rotated at p; raw keys cached; the pooled key of each block a row completes
  std::vector<float> cs(hp.n_rot / 2), sn(hp.n_rot / 2);
  std::vector<float> mean(di);
  for (int t = 0; t < T; t++) {
    const int64_t p = pos0 + t;
    rope_angles(hp.n_rot, p, hp.rope_theta, cs.data(), sn.data());
    for (int64_t h = 0; h < ni; h++) {
      float* q = qi.data() + ((size_t)t * ni + h) * di;
      rmsnorm(q, w.idx.q_norm.data(), di, hp.rms_eps, q);
      rope_neox(q, hp.n_rot, cs.data(), sn.data());
    }
    std::copy(kr.data() + (size_t)t * di, kr.data() + (size_t)(t + 1) * di, qs.raw_at(p));
    if ((p + 1) % r == 0) {
      const int64_t b = (p + 1) / r - 1, first = b * r;
      for (int64_t i = 0; i < di; i++) {
        float s = qs.raw_at(first)[i];
        for (int64_t j = 1; j < r; j++) s = s + qs.raw_at(first + j)[i];
        mean[i] = s / (float)r;
      }
      float* pk = qs.pooled_at(b);
      rmsnorm(mean.data(), w.idx.k_norm.data(), di, hp.rms_eps, pk);
      rope_angles(hp.n_rot, first, hp.rope_theta, cs.data(), sn.data());
      rope_neox(pk, hp.n_rot, cs.data(), sn.data());
    }
  }

  // per row: the attended cells (all of 0..p when dense). The block scores of a run of rows come from one
  // product of the pooled keys with those rows' indexer heads (each score one fixed kernel computation,
  // whatever rows or blocks share the product); runs of kScoreRows rows bound the scratch of long prompts.
  constexpr int kScoreRows = 16;
  std::vector<std::vector<int32_t>> cells((size_t)T);
  if (qs.record) qs.selected.assign((size_t)T, {});
  std::vector<float> s;
  std::vector<int32_t> sel;
  const float sqrt_di = std::sqrt((float)di);  // divided by, as transformers does
  for (int t0 = 0; t0 < T; t0 += kScoreRows) {
    const int t1 = std::min(T, t0 + kScoreRows);
    const int64_t nc = (pos0 + t1) / r;  // complete blocks of the run's last row
    if (nc <= kb) continue;               // every row of the run is dense
    sc.resize((size_t)(t1 - t0) * ni * nc);  // [row][ni][nc]
    MatView P;
    P.data = reinterpret_cast<const uint8_t*>(qs.pooled_at(0));
    P.type = GGML_F32;
    P.rows = nc;
    P.cols = di;
    P.row_bytes = (size_t)di * sizeof(float);
    matmul(m.pool(), P, qi.data() + (size_t)t0 * ni * di, di, (t1 - t0) * (int)ni, sc.data(), nc);
    for (int t = t0; t < t1; t++) {
      const int64_t p = pos0 + t, n_c = (p + 1) / r;
      if (n_c <= kb) continue;  // dense
      // s_b = (relu(score_0b) + relu(score_1b) + ...) / sqrt(di), heads in order (blocks vectorise)
      s.assign((size_t)n_c, 0.f);
      for (int64_t h = 0; h < ni; h++) {
        const float* row = sc.data() + ((size_t)(t - t0) * ni + h) * nc;
        for (int64_t b = 0; b < n_c; b++) s[b] = s[b] + std::max(0.f, row[b]);
      }
      for (int64_t b = 0; b < n_c; b++) s[b] = s[b] / sqrt_di;
      qsa_select_blocks(s.data(), n_c, kb, sel);
      if (qs.record) qs.selected[t] = sel;
      std::vector<int32_t>& c = cells[t];
      c.reserve((size_t)(kb * r + r));
      for (int32_t b : sel)
        for (int64_t j = 0; j < r; j++) c.push_back((int32_t)(b * r + j));
      for (int64_t q = n_c * r; q <= p; q++) c.push_back((int32_t)q);
    }
  }

  // attention: per (KV head, row); a sparse row attends to its cell list (ascending)
  const float scale = 1.f / std::sqrt((float)hd);
  const float* qgp = qg.data();
  float* attp = att.data();
  ThreadPool& pool = m.pool();
  pool.parallel_for(nkv * T, [&](int64_t jb, int64_t je, int) {
    std::vector<float> scratch;
    for (int64_t job = jb; job < je; job++) {
      const int64_t g = job / T, t = job % T, p = pos0 + t;
      const float* q = qgp + ((size_t)t * nh + g * group) * hd * 2;
      float* o = attp + ((size_t)t * nh + g * group) * hd;
      const std::vector<int32_t>& c = cells[t];
      AttendArgs a{q, nh * hd * 2, 2 * hd, 1, (int)group, kv.k_at(0) + g * hd, kv.v_at(0) + g * hd, kv.width, p + 1,
                   hd, scale, o, nh * hd, hd};
      if (!c.empty()) {
        a.cells = c.data();
        a.n = (int64_t)c.size();
      }
      scratch.resize((size_t)attend_scratch(a));
      attend(a, scratch.data());
    }
  }, 1, T);
  attn_output(m, w, att.data(), qg.data(), T, out);
}

}  // namespace strata
