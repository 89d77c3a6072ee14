// PLE, hashed n-gram per-layer embeddings (qwen4exp.md 1.7), per token at position p of the PLE layer:
//   c_s   = id[p-s] unless an EOS lies in p-s .. p-1 or p-s < 0, then EOS          (s = 0 .. N-1)
//   x_n   = (c_0*m_0) ^ (c_1*m_1) ^ ... ^ (c_{n-1}*m_{n-1})   in u64              (n = 2 .. N)
//   row_h = x_n mod V_h + O_h  for the heads of order n      E = concat_h table[row_h]   [P]
//   key   = gnorm(key_proj E; norm_key) [hc][H]   value = value_proj E [H]   query = gnorm(X; norm_query)
//   g_j   = signed sqrt of (key_j . query_j) / sqrt(H)      V'_j = sigmoid(g_j) * value
//   out   = V' + silu(dilated causal conv(gnorm(V'; norm_conv)))   kernel Kp, dilation N, depthwise
// (gnorm: the ZC-RMSNorm of each stream's H values, each stream with its own weights.)
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/rowops.h"
#include "kernels/types.h"
#include "model/layers.h"
#include "model/ops.h"
#include "model/ple_table.h"
#include "strata.h"

namespace strata {

PleTable::PleTable(const GgufFile& f, const MatView& table, uint64_t file_offset, uint64_t map_budget_bytes)
    : f_(f), t_(table), off_(file_offset) {
  const uint64_t bytes = (uint64_t)t_.rows * t_.row_bytes;
  pread_ = bytes > map_budget_bytes;
  if (!pread_) {
    // random rows: no read-ahead around each touched page (advice only; failure changes speed, not output)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t b = (uintptr_t)t_.data & ~(page - 1), e = (uintptr_t)t_.data + bytes;
    madvise(reinterpret_cast<void*>(b), e - b, MADV_RANDOM);
  }
}

void PleTable::row(int64_t r, float* out) const {
  STRATA_CHECK(r >= 0 && r < t_.rows, f_.path(), ": PLE row ", r, " outside per_layer_token_embd.weight's ", t_.rows,
               " rows");
  const TypeTraits* tt = type_traits(t_.type);
  if (!pread_) {
    tt->dequant(t_.data + (size_t)r * t_.row_bytes, out, t_.cols);
    return;
  }
  thread_local std::vector<uint8_t> buf;
  buf.resize(t_.row_bytes);
  const uint64_t at = off_ + (uint64_t)r * t_.row_bytes;
  size_t got = 0;
  while (got < t_.row_bytes) {
    const ssize_t n = pread(f_.fd(), buf.data() + got, t_.row_bytes - got, (off_t)(at + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail<std::runtime_error>(f_.path(), ": reading PLE row ", r, " of per_layer_token_embd.weight at byte ", at, ": ",
                               n < 0 ? std::strerror(errno) : "unexpected end of file");
    got += (size_t)n;
  }
  tt->dequant(buf.data(), out, t_.cols);
}

namespace {

// The table rows of one token: n-gram context c_0..c_{N-1} (c_0 = the token) -> nH row ids.
void ngram_rows(const PleParams& p, const int32_t* ctx, int64_t* rows) {
  const int64_t N = p.ngram, hpn = p.heads_per_ngram;
  for (int64_t n = 2; n <= N; n++) {
    uint64_t x = (uint64_t)ctx[0] * p.multipliers[0];
    for (int64_t s = 1; s < n; s++) x ^= (uint64_t)ctx[s] * p.multipliers[s];
    for (int64_t j = 0; j < hpn; j++) {
      const int64_t h = (n - 2) * hpn + j;
      rows[h] = (int64_t)(x % p.head_vocab[h] + p.head_offsets[h]);
    }
  }
}

// ZC-RMSNorm of each of the hc streams of v [hc*H] with its own H weights.
void grouped_rmsnorm(const float* v, const float* w, int64_t hc, int64_t H, float eps, float* out) {
  for (int64_t j = 0; j < hc; j++) rmsnorm(v + j * H, w + j * H, H, eps, out + j * H);
}

}  // namespace

void ple_layer(const Model& m, const PleWeights& w, PleState& st, const float* X, const int32_t* tokens,
               const std::vector<int32_t>& history, int T, int64_t pos0, bool in_place, float* out) {
  const HParams& hp = m.hp();
  const PleParams& p = hp.ple;
  const int64_t H = hp.n_embd, hc = hp.hc, W = hc * H, P = p.embed_dim(), nH = p.n_heads(), dP = p.row_dim;
  const int64_t N = p.ngram, Kp = p.conv_kernel, hist = p.history();
  STRATA_CHECK(T >= 1 && w.present && m.ple_table(), "ple: no PLE layer");
  STRATA_CHECK(st.width == W && st.history == hist, "ple: state has width ", st.width, " x ", st.history,
               " rows, the model needs ", W, " x ", hist);
  STRATA_CHECK((int64_t)history.size() == pos0, "ple: ", history.size(), " committed tokens at position ", pos0);
  STRATA_CHECK(in_place || T <= (int64_t)(st.rows.size() / W), "ple: a verify window of ", T, " rows exceeds ",
               st.rows.size() / W);
  thread_local FBuf E, key, val, q, vp, vn, cat;
  E.resize((size_t)T * P);      // [T][nH][dP]
  key.resize((size_t)T * W);    // [T][hc][H]
  val.resize((size_t)T * H);
  q.resize(W);
  vp.resize((size_t)T * W);     // V'  [T][hc][H]
  vn.resize((size_t)T * W);     // gnorm(V')
  cat.resize((size_t)(hist + T) * W);  // [committed history ++ this window's normed rows]

  // 1. n-gram rows of every row, the table rows gathered
  std::vector<int32_t> ctx(N);
  std::vector<int64_t> rows(nH);
  auto token_at = [&](int64_t pos) { return pos < pos0 ? history[pos] : tokens[pos - pos0]; };
  for (int t = 0; t < T; t++) {
    const int64_t pos = pos0 + t;
    ctx[0] = tokens[t];
    bool cut = false;  // an EOS (or the sequence start) at pos-s or later cuts the context at every shift >= s
    for (int64_t s = 1; s < N; s++) {
      if (pos - s < 0 || token_at(pos - s) == p.eos) cut = true;
      ctx[s] = cut ? p.eos : token_at(pos - s);
    }
    ngram_rows(p, ctx.data(), rows.data());
    for (int64_t h = 0; h < nH; h++) m.ple_table()->row(rows[h], E.data() + (size_t)t * P + h * dP);
  }

  // 2. key and value projections
  ThreadPool& pool = m.pool();
  const MatOut kv[2] = {{&w.key, key.data(), W}, {&w.value, val.data(), H}};
  matmul_many(pool, kv, 2, E.data(), P, T);

  // 3. gates per stream, V', its grouped norm
  const float sqrt_h = std::sqrt((float)H);  // divided by, as transformers does
  for (int t = 0; t < T; t++) {
    float* kt = key.data() + (size_t)t * W;
    grouped_rmsnorm(kt, w.norm_key.data(), hc, H, hp.rms_eps, kt);
    grouped_rmsnorm(X + (size_t)t * W, w.norm_query.data(), hc, H, hp.rms_eps, q.data());
    for (int64_t j = 0; j < hc; j++) {
      const float gate = dot16(kt + j * H, q.data() + j * H, H) / sqrt_h;
      const float mag = std::sqrt(std::max(std::fabs(gate), 1e-6f));
      const float g = gate > 0 ? mag : gate < 0 ? -mag : 0.f;
      const float s = sigmoid(g);
      const float* v = val.data() + (size_t)t * H;
      float* o = vp.data() + (size_t)t * W + j * H;
      for (int64_t i = 0; i < H; i++) o[i] = s * v[i];
    }
    grouped_rmsnorm(vp.data() + (size_t)t * W, w.norm_conv.data(), hc, H, hp.rms_eps, vn.data() + (size_t)t * W);
  }

  // 4. dilated depthwise causal conv over [history ++ window rows], SiLU, plus V'
  std::memcpy(cat.data(), st.conv.data(), (size_t)hist * W * sizeof(float));
  std::memcpy(cat.data() + (size_t)hist * W, vn.data(), (size_t)T * W * sizeof(float));
  for (int t = 0; t < T; t++) {
    float* o = out + (size_t)t * W;
    for (int64_t c = 0; c < W; c++) {
      float acc = 0.f;
      for (int64_t k = 0; k < Kp; k++) acc = acc + w.conv[k * W + c] * cat[(size_t)(hist + t - (Kp - 1 - k) * N) * W + c];
      o[c] = acc;
    }
    silu_inplace(o, W);
    const float* v = vp.data() + (size_t)t * W;
    for (int64_t c = 0; c < W; c++) o[c] = v[c] + o[c];
  }

  // 5. state: in place, or the window's rows saved for commit(keep)
  if (in_place) {
    st.push(vn.data(), T);
    st.n_rows = 0;
  } else {
    std::memcpy(st.rows.data(), vn.data(), (size_t)T * W * sizeof(float));
    st.n_rows = T;
  }
}

}  // namespace strata
