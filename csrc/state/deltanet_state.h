// Gated DeltaNet state of one layer: the recurrence S (per value head, dk x dv, fp32) and the conv
// history (the last d_conv-1 pre-conv rows). Neither is positional.
//
// Rollback contract (engine spec 3): a T = 1 step and a prompt window update S and the history in the
// step ("in place"). A verify window with T > 1 never writes the committed S or history: its rows run
// on S_work (a copy) and each row's replay inputs are saved (l2-normed k, v, exp(g), beta, raw pre-conv
// row). fold_layers(pool, layers, first, n) replays saved rows first..first+n-1 into S with the window's
// own update (dn_rows), so the folded state is bit-identical to serial stepping; when the fold covers
// every row that ran on S_work, S_work already *is* that state and is swapped in instead.
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct DeltaNetState {
  int64_t nk = 0, nv = 0, dk = 0, dv = 0, conv_dim = 0, d_conv = 0;
  std::vector<float> S;       // committed [nv][dk][dv]
  std::vector<float> conv;    // committed [d_conv-1][conv_dim], oldest row first
  std::vector<float> S_work;  // window scratch [nv][dk][dv]
  // Replay inputs of the last window, one slot per row (max_window rows).
  std::vector<float> k_rows;     // [row][nk][dk]   (after l2norm)
  std::vector<float> v_rows;     // [row][nv][dv]   (after conv + SiLU)
  std::vector<float> eg_rows;    // [row][nv]       exp(g)
  std::vector<float> beta_rows;  // [row][nv]
  std::vector<float> raw_rows;   // [row][conv_dim] pre-conv
  int64_t work_first = 0, work_rows = 0;  // saved rows work_first..work_first+work_rows-1 ran on S_work

  void init(int64_t nk_, int64_t nv_, int64_t dk_, int64_t dv_, int64_t d_conv_, int max_window);
  void reset();
  // The fold of saved rows [first, first+n) in parts, so that the heads of all layers can replay in one
  // parallel region (fold_layers):
  bool fold_swaps(int64_t first, int64_t n) const;          // S_work already is the folded state
  void replay_head(int64_t h, int64_t first, int64_t n);     // rows into S for value head h
  void fold_finish(int64_t first, int64_t n);                // swap if fold_swaps, then the conv history
  // Shifts one raw pre-conv row into the committed history.
  void push_conv(const float* raw);
};

class ThreadPool;
// Replays saved rows [first, first+n) of every layer into S (or swaps S_work in) and shifts their raw rows
// into the conv history; the replaying heads of all layers split over the pool.
void fold_layers(ThreadPool& pool, std::vector<DeltaNetState>& layers, int64_t first, int64_t n);

// One delta-rule update of one value head (row by row: the twin of dn_rows below):
//   S <- S * eg;  m = S^T k;  delta = beta * (v - m);  S <- S + k delta^T
// S is [dk][dv] with dv contiguous. m_scratch has dv floats.
void dn_update(float* S, const float* k, const float* v, float eg, float beta, int64_t dk, int64_t dv,
               float* m_scratch);
// dn_update, then o = S^T q, the read fused into the update's last pass over S.
void dn_update_read(float* S, const float* k, const float* v, float eg, float beta, const float* q, int64_t dk,
                    int64_t dv, float* m_scratch, float* o);

// Several consecutive rows of one value head. Row t's inputs; o == nullptr: update only (no read).
struct DnRow {
  const float* k;  // [dk]
  const float* v;  // [dv]
  const float* q;  // [dk] (unused without o)
  float eg, beta;
  float* o;        // [dv] or nullptr
};
// Rows 0..n_src-1 update S; then S_work becomes a copy of S and rows n_src..T-1 update S_work
// (n_src = T: in place; 0: a verify window; 1: the partial fold). The same values as dn_update_read /
// dn_update called row after row, bit for bit, computed strip by strip: column j of S only ever meets
// column j of v, m and o, so a 64-column strip (32 KB for dk = 128) runs all T rows while it stays in L1
// instead of S streaming through the cache twice per row.
void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv);
// dn_rows built with AVX-512 / AVX2 flags (kernels/cpu/deltanet_avx512.cpp, deltanet_avx2.cpp: the fused
// strip form of kernels/cpu/dn_fused_impl.h); dn_rows picks the active ISA's build.
void dn_rows_avx512(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv);
void dn_rows_avx2(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv);
// The row-by-row twin of dn_rows (dn_update_read / dn_update per row), for tests.
void dn_rows_ref(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv);

}  // namespace strata
