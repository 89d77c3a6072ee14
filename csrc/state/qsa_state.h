// QSA indexer state of one qwen4exp attention layer (qwen4exp.md 1.5, 5; engine spec 7): one raw indexer key
// per position (no norm, no RoPE) and the pooled key of each complete block (mean of its r raw keys,
// k-norm, RoPE at the block's first position). The K/V cells are the layer's KvCache.
//
// Rollback contract: by counter, like KvCache. raw[p] is positional: a window writes cells pos0..pos0+T-1
// and cells at or beyond the committed position are scratch, rewritten before any read. pooled[b] is
// positional by block: it is written only by the row at the block's last position e = b*r + r - 1, from
// raw cells e-r+1..e that hold exactly that row's view (committed cells and the window's own earlier rows),
// and read only by queries at positions >= e. A block is final once e is committed; a window that
// completes a block and is then cut leaves a scratch entry that the next row at e rewrites before any
// query reads it. So commit(keep) needs nothing, windows may start anywhere inside a block and cross any
// number of block boundaries, and a checkpoint at position P holds raw[0..P) and pooled[0..P/r).
// (The design not to copy: a 4-slot raw-key ring indexed by cell & 3, which a window that wraps it
// overwrites with committed keys lost; background note "qsa".)
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct QsaState {
  int64_t n_ctx = 0, dim = 0, ratio = 0;
  std::vector<float> raw;     // [n_ctx][dim]
  std::vector<float> pooled;  // [n_ctx / ratio][dim], normed and rotated
  // Tests: with record, the last run's selected blocks per row (ascending; empty for a dense row).
  bool record = false;
  std::vector<std::vector<int32_t>> selected;
  void init(int64_t ctx, int64_t d, int64_t r) {
    n_ctx = ctx;
    dim = d;
    ratio = r;
    raw.assign((size_t)ctx * d, 0.f);
    pooled.assign((size_t)(ctx / r + 1) * d, 0.f);
  }
  bool active() const { return ratio > 0; }
  int64_t blocks_below(int64_t pos) const { return pos / ratio; }  // complete blocks of positions [0, pos)
  float* raw_at(int64_t p) { return raw.data() + (size_t)p * dim; }
  const float* raw_at(int64_t p) const { return raw.data() + (size_t)p * dim; }
  float* pooled_at(int64_t b) { return pooled.data() + (size_t)b * dim; }
  const float* pooled_at(int64_t b) const { return pooled.data() + (size_t)b * dim; }
};

}  // namespace strata
