// Gated DeltaNet (spec qwen3next.md 1.5, qwen4exp.md 1.4): projections (qwen3next's attn_qkv + attn_gate +
// ssm_ba or the legacy fused ssm_in, both grouped per key head; or Qwen3.5's attn_qkv + attn_gate +
// ssm_beta + ssm_alpha with value heads tiled, brought to the grouped order here), causal depthwise
// conv + SiLU over q|k|v, l2norm(q, k), q / sqrt(dk), g = ssm_a * softplus(a + dt_bias)
// (ssm_a = -exp(A_log)), beta = sigmoid(b), value head h reads key head h / (nv / nk), the delta rule
// (deltanet_state.h), gated RMSNorm * silu(z) (qwen4exp: * sigmoid(z)), then ssm_out.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/rowops.h"
#include "model/layers.h"
#include "model/ops.h"
#include "state/deltanet_chunked.h"
#include "strata.h"

namespace strata {

void deltanet_layer(const Model& m, const DeltaNetWeights& w, DeltaNetState& st, const float* x, int T, DnMode mode,
                    float* out) {
  // chunked prefill (state/deltanet_chunked.h): a prompt window in place, its recurrence in chunks
  const bool chunked = mode == DnMode::Chunked;
  if (chunked) mode = DnMode::InPlace;
  const HParams& hp = m.hp();
  const int64_t H = hp.n_embd, nk = st.nk, nv = st.nv, dk = st.dk, dv = st.dv, r = nv / nk;
  const int64_t key_dim = nk * dk, d_inner = nv * dv, cd = st.conv_dim, K = st.d_conv;
  STRATA_CHECK(T >= 1 && (mode == DnMode::InPlace || T <= (int64_t)(st.eg_rows.size() / nv)),
               "deltanet: T = ", T, " in a verify window exceeds the saved-row capacity ", st.eg_rows.size() / nv);
  STRATA_CHECK(nk == hp.ssm_n_group && nv == hp.ssm_dt_rank && dk == hp.dk() && dv == hp.dv() && K == hp.ssm_d_conv,
               "deltanet: state dimensions do not match the model");
  thread_local FBuf raw, z, ba, hist, conv, o, y, fused;
  raw.resize((size_t)T * cd);       // [T][conv_dim] pre-conv q|k|v
  z.resize((size_t)T * d_inner);    // [T][nv][dv]
  ba.resize((size_t)T * 2 * nv);    // [T][nk][b(r) | a(r)]
  hist.resize((size_t)(K - 1 + T) * cd);
  conv.resize((size_t)T * cd);
  o.resize((size_t)T * d_inner);
  y.resize((size_t)T * d_inner);
  ThreadPool& pool = m.pool();

  if (w.layout == DnLayout::Current) {
    const MatOut proj[3] = {{&w.wqkv, raw.data(), cd}, {&w.wgate, z.data(), d_inner}, {&w.ssm_ba, ba.data(), 2 * nv}};
    matmul_many(pool, proj, 3, x, H, T);
  } else if (w.layout == DnLayout::Split) {
    // the file's value heads are tiled (slot file_head[j] holds head j): v channels, z, b and a are brought
    // to the grouped order [nk][b(r) | a(r)] of the other layouts
    thread_local FBuf fz, fb, fa;
    fz.resize((size_t)T * d_inner);
    fb.resize((size_t)T * nv);
    fa.resize((size_t)T * nv);
    const MatOut proj[4] = {{&w.wqkv, raw.data(), cd}, {&w.wgate, fz.data(), d_inner}, {&w.ssm_beta, fb.data(), nv},
                            {&w.ssm_alpha, fa.data(), nv}};
    matmul_many(pool, proj, 4, x, H, T);
    fused.resize((size_t)d_inner);
    for (int t = 0; t < T; t++) {
      float* v = raw.data() + (size_t)t * cd + 2 * key_dim;
      std::memcpy(fused.data(), v, d_inner * sizeof(float));
      for (int64_t j = 0; j < nv; j++) {
        const int64_t sl = w.file_head[j];
        std::memcpy(v + j * dv, fused.data() + sl * dv, dv * sizeof(float));
        std::memcpy(z.data() + (size_t)t * d_inner + j * dv, fz.data() + (size_t)t * d_inner + sl * dv, dv * sizeof(float));
        ba[(size_t)t * 2 * nv + (j / r) * 2 * r + j % r] = fb[(size_t)t * nv + sl];
        ba[(size_t)t * 2 * nv + (j / r) * 2 * r + r + j % r] = fa[(size_t)t * nv + sl];
      }
    }
  } else {
    // ssm_in rows: per key head g: [q(dk) | k(dk) | v(r*dv) | z(r*dv)]; regroup into q_all | k_all | v_all and z
    const int64_t gw = 2 * dk + 2 * r * dv;
    fused.resize((size_t)T * nk * gw);
    matmul(pool, w.ssm_in, x, H, T, fused.data(), nk * gw);
    for (int t = 0; t < T; t++)
      for (int64_t g = 0; g < nk; g++) {
        const float* src = fused.data() + ((size_t)t * nk + g) * gw;
        float* dst = raw.data() + (size_t)t * cd;
        std::memcpy(dst + g * dk, src, dk * sizeof(float));
        std::memcpy(dst + key_dim + g * dk, src + dk, dk * sizeof(float));
        std::memcpy(dst + 2 * key_dim + g * r * dv, src + 2 * dk, r * dv * sizeof(float));
        std::memcpy(z.data() + (size_t)t * d_inner + g * r * dv, src + 2 * dk + r * dv, r * dv * sizeof(float));
      }
    matmul(pool, w.ssm_ba, x, H, T, ba.data(), 2 * nv);
  }

  // causal conv over [committed history ++ this window's raw rows]; w.conv is [K][cd], tap K-1 = current row
  std::memcpy(hist.data(), st.conv.data(), (size_t)(K - 1) * cd * sizeof(float));
  std::memcpy(hist.data() + (size_t)(K - 1) * cd, raw.data(), (size_t)T * cd * sizeof(float));

  // Everything per row after the projections, one job per key head g (its q and k channels, its r value
  // heads): conv + SiLU, l2norm(q) / sqrt(dk), l2norm(k), the gates, the recurrence, the replay inputs, the
  // gated RMSNorm * silu(z). Jobs touch disjoint channels and heads; rows are sequential within a head.
  // thread_local buffers are per thread: hand the workers plain pointers.
  thread_local FBuf eg, beta, lg;
  eg.resize((size_t)T * nv);
  beta.resize((size_t)T * nv);
  lg.resize((size_t)T * nv);  // log decay g (eg = exp(g)), for the chunked form
  const float qscale = 1.f / std::sqrt((float)dk);
  const bool save = mode != DnMode::InPlace;
  const int n_src = mode == DnMode::InPlace ? T : mode == DnMode::Partial ? 1 : 0;
  const float* histp = hist.data();
  const float* rawp = raw.data();
  const float* bap = ba.data();
  const float* zp = z.data();
  float* convp = conv.data();
  float* egp = eg.data();
  float* betap = beta.data();
  float* lgp = lg.data();
  float* op = o.data();
  float* yp = y.data();
  pool.parallel_for(nk, [&](int64_t gb, int64_t ge, int) {
    std::vector<DnRow> rows((size_t)T);
    for (int64_t g = gb; g < ge; g++) {
      const int64_t cq = g * dk, ck = key_dim + g * dk, cv = 2 * key_dim + g * r * dv;
      causal_conv_silu(histp + cq, w.conv.data() + cq, T, dk, cd, (int)K, convp + cq);
      causal_conv_silu(histp + ck, w.conv.data() + ck, T, dk, cd, (int)K, convp + ck);
      causal_conv_silu(histp + cv, w.conv.data() + cv, T, r * dv, cd, (int)K, convp + cv);
      for (int t = 0; t < T; t++) {
        float* row = convp + (size_t)t * cd;
        float* q = row + cq;
        l2norm(q, dk, 1e-6f);
        for (int64_t i = 0; i < dk; i++) q[i] = q[i] * qscale;
        l2norm(row + ck, dk, 1e-6f);
        for (int64_t j = 0; j < r; j++) {
          const int64_t h = g * r + j;
          const float b = bap[(size_t)t * 2 * nv + g * 2 * r + j];
          const float a = bap[(size_t)t * 2 * nv + g * 2 * r + r + j];
          betap[t * nv + h] = sigmoid(b);
          lgp[t * nv + h] = w.ssm_a[h] * softplus(a + w.dt_bias[h]);
          egp[t * nv + h] = std::exp(lgp[t * nv + h]);
        }
      }
      for (int64_t h = g * r; h < (g + 1) * r; h++) {
        if (chunked) {
          const DnSeq seq{convp + ck, cd, convp + 2 * key_dim + h * dv, cd, convp + cq, cd, lgp + h, betap + h, nv,
                          op + h * dv, d_inner};
          dn_chunked(st.S.data() + (size_t)h * dk * dv, seq, T, dk, dv);
          continue;
        }
        for (int t = 0; t < T; t++) {
          const float* row = convp + (size_t)t * cd;
          rows[t] = {row + ck, row + 2 * key_dim + h * dv, row + cq, egp[t * nv + h], betap[t * nv + h],
                     op + (size_t)t * d_inner + h * dv};
        }
        const size_t hs = (size_t)h * dk * dv;
        dn_rows(st.S.data() + hs, st.S_work.data() + hs, rows.data(), T, n_src, dk, dv);
      }
      if (save)  // replay inputs for the fold
        for (int t = 0; t < T; t++) {
          const float* row = convp + (size_t)t * cd;
          std::memcpy(&st.k_rows[(size_t)t * key_dim + g * dk], row + ck, dk * sizeof(float));
          std::memcpy(&st.v_rows[(size_t)t * d_inner + g * r * dv], row + cv, r * dv * sizeof(float));
          for (int64_t h = g * r; h < (g + 1) * r; h++) {
            st.eg_rows[(size_t)t * nv + h] = egp[t * nv + h];
            st.beta_rows[(size_t)t * nv + h] = betap[t * nv + h];
          }
        }
      // gated RMSNorm per value head (weight not zero-centred), times silu(z)
      for (int t = 0; t < T; t++) {
        const size_t off = (size_t)t * d_inner + g * r * dv;
        for (int64_t j = 0; j < r; j++)
          rmsnorm(op + off + j * dv, w.norm.data(), dv, hp.rms_eps, yp + off + j * dv);
        if (w.gate_sigmoid) mul_sigmoid(yp + off, zp + off, r * dv);
        else mul_silu(yp + off, zp + off, r * dv);
      }
    }
  }, 1, T);
  if (save)
    for (int t = 0; t < T; t++) std::memcpy(&st.raw_rows[(size_t)t * cd], rawp + (size_t)t * cd, cd * sizeof(float));

  if (mode == DnMode::InPlace) {
    for (int t = 0; t < T; t++) st.push_conv(raw.data() + (size_t)t * cd);
    st.work_rows = 0;
  } else {
    if (mode == DnMode::Partial) {
      st.push_conv(raw.data());
      st.work_first = 1;
      st.work_rows = T - 1;
    } else {
      st.work_first = 0;
      st.work_rows = T;
    }
  }

  if (w.layout == DnLayout::Split) {  // back to the file's value-head order for ssm_out's columns
    fused.resize((size_t)T * d_inner);
    for (int t = 0; t < T; t++)
      for (int64_t j = 0; j < nv; j++)
        std::memcpy(fused.data() + (size_t)t * d_inner + w.file_head[j] * dv, y.data() + (size_t)t * d_inner + j * dv,
                    dv * sizeof(float));
    matmul(pool, w.ssm_out, fused.data(), d_inner, T, out, H);
    return;
  }
  matmul(pool, w.ssm_out, y.data(), d_inner, T, out, H);
}

}  // namespace strata
