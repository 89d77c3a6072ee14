// Gated full attention (spec qwen3next.md 1.4): q and gate interleaved per head in attn_q, zero-centred
// q/k norms before partial NeoX RoPE, GQA (query head h reads KV head h / (n_head / n_head_kv)),
// causal softmax with scale 1/sqrt(head_dim), output * sigmoid(gate), then attn_output.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/attention.h"

#include "kernels/attend.h"
#include "kernels/rowops.h"
#include "model/layers.h"
#include "model/ops.h"
#include "strata.h"

namespace strata {

void attn_project(const Model& m, const AttnWeights& w, KvCache& kv, const float* x, int T, int64_t pos0, float* qg,
                  const MatOut* extra, int n_extra) {
  const HParams& hp = m.hp();
  const int64_t H = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv;
  STRATA_CHECK(T >= 1, "attention: T = ", T);
  STRATA_CHECK(pos0 + T <= kv.n_ctx, "attention: positions ", pos0, "..", pos0 + T - 1, " exceed the context ", kv.n_ctx);
  STRATA_CHECK(kv.width == nkv * hd, "attention: KV cell width ", kv.width, " != n_head_kv * head_dim = ", nkv * hd);
  STRATA_CHECK(w.wq.rows == nh * hd * 2 && w.wq.cols == H && w.wo.cols == nh * hd, "attention: weight shapes do not fit");
  STRATA_CHECK(n_extra >= 0 && n_extra <= 4, "attention: ", n_extra, " extra products");
  thread_local FBuf kb, vb;
  kb.resize((size_t)T * nkv * hd);      // [T][nkv][hd]
  vb.resize((size_t)T * nkv * hd);
  MatOut outs[7] = {{&w.wq, qg, nh * hd * 2}, {&w.wk, kb.data(), nkv * hd}, {&w.wv, vb.data(), nkv * hd}};
  for (int i = 0; i < n_extra; i++) outs[3 + i] = extra[i];
  matmul_many(m.pool(), outs, 3 + n_extra, x, H, T);

  // norms + RoPE, then write this window's cells before any row reads
  std::vector<float> cs(hp.n_rot / 2), sn(hp.n_rot / 2);
  for (int t = 0; t < T; t++) {
    const int64_t pos = pos0 + t;
    rope_angles(hp.n_rot, pos, hp.rope_theta, cs.data(), sn.data());
    for (int64_t h = 0; h < nh; h++) {
      float* q = qg + ((size_t)t * nh + h) * hd * 2;
      rmsnorm(q, w.q_norm.data(), hd, hp.rms_eps, q);
      rope_neox(q, hp.n_rot, cs.data(), sn.data());
    }
    for (int64_t g = 0; g < nkv; g++) {
      float* k = kb.data() + ((size_t)t * nkv + g) * hd;
      rmsnorm(k, w.k_norm.data(), hd, hp.rms_eps, k);
      rope_neox(k, hp.n_rot, cs.data(), sn.data());
    }
    std::copy(kb.data() + (size_t)t * nkv * hd, kb.data() + (size_t)(t + 1) * nkv * hd, kv.k_at(pos));
    std::copy(vb.data() + (size_t)t * nkv * hd, vb.data() + (size_t)(t + 1) * nkv * hd, kv.v_at(pos));
  }
}

void attn_output(const Model& m, const AttnWeights& w, float* att, const float* qg, int T, float* out) {
  const HParams& hp = m.hp();
  const int64_t hd = hp.head_dim, nh = hp.n_head;
  for (int t = 0; t < T; t++)
    for (int64_t h = 0; h < nh; h++)
      mul_sigmoid(att + ((size_t)t * nh + h) * hd, qg + ((size_t)t * nh + h) * hd * 2 + hd, hd);
  matmul(m.pool(), w.wo, att, nh * hd, T, out, hp.n_embd);
}

void attention_layer(const Model& m, const AttnWeights& w, KvCache& kv, const float* x, int T, int64_t pos0,
                     float* out) {
  const HParams& hp = m.hp();
  const int64_t hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, group = nh / nkv;
  thread_local FBuf qg, att;
  qg.resize((size_t)T * nh * hd * 2);   // [T][nh][q(hd) | gate(hd)]
  att.resize((size_t)T * nh * hd);      // [T][nh][hd]
  attn_project(m, w, kv, x, T, pos0, qg.data(), nullptr, 0);
  ThreadPool& pool = m.pool();

  const float scale = 1.f / std::sqrt((float)hd);
  // thread_local buffers are per thread: hand the workers plain pointers
  const float* qgp = qg.data();
  float* attp = att.data();
  // jobs: a KV head with a run of rows (all T rows when there are enough KV heads for the threads); a long
  // prompt window in runs of at most 64 rows. The runs are not shortened to fit a job's scores (rows x heads
  // x cells) in L2: measured (bench_attend), the score buffer's passes stream well from L3, while every job
  // reads all of its KV head's cells again, so shorter runs cost more per row at long contexts
  // (docs/BENCHMARKS.md, issue 16)
  const int64_t chunks = std::min<int64_t>(
      T, std::max<int64_t>({(int64_t)1, (pool.size() + nkv - 1) / nkv, (T + 63) / 64}));
  const int64_t rows_per = (T + chunks - 1) / chunks;
  pool.parallel_for(nkv * chunks, [&](int64_t b, int64_t e, int) {
    std::vector<float> sc;
    for (int64_t job = b; job < e; job++) {
      const int64_t g = job / chunks, t0 = (job % chunks) * rows_per, tn = std::min<int64_t>(rows_per, T - t0);
      if (tn <= 0) continue;
      const float* q = qgp + ((size_t)t0 * nh + g * group) * hd * 2;  // row t0, first query head of the group
      float* o = attp + ((size_t)t0 * nh + g * group) * hd;
      const AttendArgs args{q, nh * hd * 2, 2 * hd, (int)tn, (int)group, kv.k_at(0) + g * hd, kv.v_at(0) + g * hd,
                            kv.width, pos0 + t0 + 1, hd, scale, o, nh * hd, hd};
      sc.resize((size_t)attend_scratch(args));
      attend(args, sc.data());
    }
  }, 1, T);
  attn_output(m, w, att.data(), qg.data(), T, out);
}

}  // namespace strata
