// The gated delta rule over the rows of a prompt window in chunks of kDnChunk rows: the chunked (WY) form of
// HF transformers' torch_chunk_gated_delta_rule and FLA's chunk_gated_delta_rule, which turns the row-by-row
// recurrence of deltanet_state.h (S <- S exp(g); d = beta (v - S^T k); S <- S + k d^T; o = S^T q) into
// matrix products. Within a chunk of C rows with G_i = g_0 + ... + g_i and the chunk's starting state S0:
//   L[i][j] = beta_i exp(G_i - G_j) k_i.k_j  (j < i),  W = (I + L)^-1   (forward substitution)
//   D = W (beta v) - W (beta exp(G) k) S0                      the rows' deltas        [C][dv]
//   o_i = exp(G_i) S0^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i.k_j) d_j
//   S = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j d_j^T
// Exactness: S and every o equal serial T = 1 steps within float32 rounding, not bit for bit (other sums in
// another order). It is used for prompt windows only, which commit every row (engine spec 2.6); decode steps
// and verify windows keep dn_rows, so windows still equal serial decoding bit for bit after a chunked prefill.
// Every ISA build of it gives the same bits (one source of elementwise multiplies and adds, no contraction:
// state/dn_chunked_impl.h), so a prefill never depends on the CPU's path.
#pragma once
#include <cstdint>

namespace strata {

constexpr int kDnChunk = 64;

// The rows of one value head: row t's k at k + t * ldk, etc.; g is the log decay (exp(g) is dn_rows' eg).
struct DnSeq {
  const float* k;    // [T][ldk], dk used (l2-normed)
  int64_t ldk;
  const float* v;    // [T][ldv], dv used
  int64_t ldv;
  const float* q;    // [T][ldq], dk used (l2-normed and scaled)
  int64_t ldq;
  const float* g;    // g[t * ldgb]
  const float* beta; // beta[t * ldgb]
  int64_t ldgb;
  float* o;          // [T][ldo], dv written
  int64_t ldo;
};

// S [dk][dv] (dv contiguous) is the state before row 0 and becomes the state after row T-1.
void dn_chunked(float* S, const DnSeq& seq, int T, int64_t dk, int64_t dv);
// The build of an Isa value (kernels/matmul.h), for tests.
void dn_chunked_on(int isa, float* S, const DnSeq& seq, int T, int64_t dk, int64_t dv);
void dn_chunked_avx2(float* S, const DnSeq& seq, int T, int64_t dk, int64_t dv);
void dn_chunked_avx512(float* S, const DnSeq& seq, int T, int64_t dk, int64_t dv);

}  // namespace strata
