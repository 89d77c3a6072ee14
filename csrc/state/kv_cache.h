// Attention K/V for one gated-attention layer: positional cells, float32.
//
// Rollback contract: by counter. A window writes cells pos0..pos0+T-1; commit(keep) only moves the
// session position. Cells at or beyond the committed position are scratch: the next window rewrites
// them before any causal read (a row at position p reads cells 0..p only, and the window writes all
// its cells before any row reads).
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct KvCache {
  int64_t n_ctx = 0;
  int64_t width = 0;  // n_head_kv * head_dim
  std::vector<float> k, v;
  void init(int64_t ctx, int64_t w) {
    n_ctx = ctx;
    width = w;
    k.assign((size_t)ctx * w, 0.f);
    v.assign((size_t)ctx * w, 0.f);
  }
  float* k_at(int64_t pos) { return k.data() + (size_t)pos * width; }
  float* v_at(int64_t pos) { return v.data() + (size_t)pos * width; }
  const float* k_at(int64_t pos) const { return k.data() + (size_t)pos * width; }
  const float* v_at(int64_t pos) const { return v.data() + (size_t)pos * width; }
};

}  // namespace strata
