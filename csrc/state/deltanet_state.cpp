#include "state/deltanet_state.h"

#include <cstring>

#include "kernels/matmul.h"
#include "state/dn_rows_impl.h"
#include "util/common.h"
#include "util/threads.h"

namespace strata {

void DeltaNetState::init(int64_t nk_, int64_t nv_, int64_t dk_, int64_t dv_, int64_t d_conv_, int max_window) {
  nk = nk_;
  nv = nv_;
  dk = dk_;
  dv = dv_;
  d_conv = d_conv_;
  conv_dim = 2 * nk * dk + nv * dv;
  S.assign((size_t)nv * dk * dv, 0.f);
  S_work.assign(S.size(), 0.f);
  conv.assign((size_t)(d_conv - 1) * conv_dim, 0.f);
  k_rows.assign((size_t)max_window * nk * dk, 0.f);
  v_rows.assign((size_t)max_window * nv * dv, 0.f);
  eg_rows.assign((size_t)max_window * nv, 0.f);
  beta_rows.assign((size_t)max_window * nv, 0.f);
  raw_rows.assign((size_t)max_window * conv_dim, 0.f);
  work_first = work_rows = 0;
}

void DeltaNetState::reset() {
  std::fill(S.begin(), S.end(), 0.f);
  std::fill(conv.begin(), conv.end(), 0.f);
  work_first = work_rows = 0;
}

void DeltaNetState::push_conv(const float* raw) {
  const int64_t h = d_conv - 1;
  if (h <= 0) return;
  std::memmove(conv.data(), conv.data() + conv_dim, (size_t)(h - 1) * conv_dim * sizeof(float));
  std::memcpy(conv.data() + (h - 1) * conv_dim, raw, (size_t)conv_dim * sizeof(float));
}

bool DeltaNetState::fold_swaps(int64_t first, int64_t n) const { return first == work_first && n == work_rows; }

void DeltaNetState::replay_head(int64_t h, int64_t first, int64_t n) {
  const int64_t r = nv / nk;
  std::vector<DnRow> rows((size_t)n);
  for (int64_t i = first; i < first + n; i++)
    rows[i - first] = {&k_rows[((size_t)i * nk + h / r) * dk], &v_rows[((size_t)i * nv + h) * dv], nullptr,
                       eg_rows[i * nv + h], beta_rows[i * nv + h], nullptr};
  dn_rows(&S[(size_t)h * dk * dv], nullptr, rows.data(), (int)n, (int)n, dk, dv);
}

void DeltaNetState::fold_finish(int64_t first, int64_t n) {
  if (fold_swaps(first, n)) S.swap(S_work);  // S_work ran exactly these rows from S: it is the folded state
  for (int64_t i = first; i < first + n; i++) push_conv(&raw_rows[(size_t)i * conv_dim]);
  work_rows = 0;
}

void fold_layers(ThreadPool& pool, std::vector<DeltaNetState>& layers, int64_t first, int64_t n) {
  if (n <= 0) return;
  std::vector<std::pair<DeltaNetState*, int64_t>> heads;  // (layer, head) pairs that replay
  for (auto& st : layers)
    if (!st.fold_swaps(first, n))
      for (int64_t h = 0; h < st.nv; h++) heads.push_back({&st, h});
  pool.parallel_for((int64_t)heads.size(), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; i++) heads[i].first->replay_head(heads[i].second, first, n);
  }, 1, n);
  for (auto& st : layers) st.fold_finish(first, n);
}

// First half of a step, shared by dn_update and dn_update_read: S <- S * eg, then
// m <- beta * (v - S^T k), the delta of the rank-1 update.
static inline void dn_decay_delta(float* S, const float* k, const float* v, float eg, float beta, int64_t dk,
                                  int64_t dv, float* m) {
  for (int64_t j = 0; j < dv; j++) m[j] = 0.f;
  for (int64_t a = 0; a < dk; a++) {
    float* row = S + a * dv;
    const float ka = k[a];
    for (int64_t j = 0; j < dv; j++) {
      row[j] = row[j] * eg;
      m[j] = m[j] + row[j] * ka;
    }
  }
  for (int64_t j = 0; j < dv; j++) m[j] = (v[j] - m[j]) * beta;
}

void dn_update(float* S, const float* k, const float* v, float eg, float beta, int64_t dk, int64_t dv,
               float* m) {
  dn_decay_delta(S, k, v, eg, beta, dk, dv, m);
  for (int64_t a = 0; a < dk; a++) {
    float* row = S + a * dv;
    const float ka = k[a];
    for (int64_t j = 0; j < dv; j++) row[j] = row[j] + ka * m[j];
  }
}

void dn_update_read(float* S, const float* k, const float* v, float eg, float beta, const float* q, int64_t dk,
                    int64_t dv, float* m, float* o) {
  // dn_update, then o = sum_a S[a] * q[a] accumulated in increasing a, fused into the update's last pass.
  dn_decay_delta(S, k, v, eg, beta, dk, dv, m);
  for (int64_t j = 0; j < dv; j++) o[j] = 0.f;
  for (int64_t a = 0; a < dk; a++) {
    float* row = S + a * dv;
    const float ka = k[a], qa = q[a];
    for (int64_t j = 0; j < dv; j++) {
      row[j] = row[j] + ka * m[j];
      o[j] = o[j] + row[j] * qa;
    }
  }
}

void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) {
  STRATA_CHECK(T >= 1 && n_src >= 0 && (n_src >= T || S_work), "dn_rows: T = ", T, ", n_src = ", n_src);
  switch (active_isa()) {
    case Isa::AVX512: return dn_rows_avx512(S, S_work, rows, T, n_src, dk, dv);
    case Isa::AVX2: return dn_rows_avx2(S, S_work, rows, T, n_src, dk, dv);
    default: return dn_rows_impl(S, S_work, rows, T, n_src, dk, dv);
  }
}

void dn_rows_ref(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) {
  STRATA_CHECK(T >= 1 && n_src >= 0 && (n_src >= T || S_work), "dn_rows: T = ", T, ", n_src = ", n_src);
  std::vector<float> m(dv);
  float* Sc = S;
  for (int t = 0; t < T; t++) {
    if (t == n_src) {
      std::memcpy(S_work, S, (size_t)dk * dv * sizeof(float));
      Sc = S_work;
    }
    const DnRow& R = rows[t];
    if (R.o) dn_update_read(Sc, R.k, R.v, R.eg, R.beta, R.q, dk, dv, m.data(), R.o);
    else dn_update(Sc, R.k, R.v, R.eg, R.beta, dk, dv, m.data());
  }
}

}  // namespace strata
