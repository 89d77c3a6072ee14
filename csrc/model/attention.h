// The parts of gated attention (qwen3next.md 1.4) that dense and QSA attention share.
#pragma once
#include <cstdint>

#include "kernels/matmul.h"
#include "model/weights.h"
#include "state/kv_cache.h"

namespace strata {

class Model;

// q/gate, k, v for T rows at pos0 (plus `extra` products of the same x, in the same parallel region):
// qg [T][nh][q(hd) | gate(hd)] with q normed and rotated; K/V cells pos0..pos0+T-1 written (k normed and
// rotated) before any row reads them.
void attn_project(const Model& m, const AttnWeights& w, KvCache& kv, const float* x, int T, int64_t pos0, float* qg,
                  const MatOut* extra, int n_extra);
// out [T][H] = wo . (att * sigmoid(gate)); att [T][nh][hd] is gated in place.
void attn_output(const Model& m, const AttnWeights& w, float* att, const float* qg, int T, float* out);

}  // namespace strata
