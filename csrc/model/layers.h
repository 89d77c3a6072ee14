// The layer functions the architectures are built from, each over T rows, and the per-architecture graphs.
//   attention.cpp  gated attention (qwen3next.md 1.4)        deltanet.cpp  Gated DeltaNet (1.5; qwen4exp.md 1.4)
//   moe.cpp        sparse MoE + shared expert (1.6)          qsa.cpp       QSA sparse attention (qwen4exp.md 1.5)
//   hyperconn.cpp  hyper-connection streams (qwen4exp.md 1.3) ple.cpp      PLE n-gram embeddings (qwen4exp.md 1.7)
#pragma once
#include <cstdint>
#include <vector>

#include "model/weights.h"
#include "state/deltanet_state.h"
#include "state/kv_cache.h"
#include "state/ple_state.h"
#include "state/qsa_state.h"

namespace strata {

class Model;

// Gated full attention: x [T][H] (normed) at positions pos0.. -> out [T][H]. Writes K/V cells pos0..pos0+T-1.
void attention_layer(const Model& m, const AttnWeights& w, KvCache& kv, const float* x, int T, int64_t pos0,
                     float* out);
// QSA attention (w.qsa): the gated attention above where each query attends only to the blocks its
// indexer selects plus its tail. Writes K/V cells, raw index keys and the pooled keys of completed blocks.
void qsa_layer(const Model& m, const AttnWeights& w, KvCache& kv, QsaState& qs, const float* x, int T, int64_t pos0,
               float* out);

// QSA's selection rule (exposed for tests): the kb of n_c block scores s that a sparse query keeps, ties to
// the lower block index, NaN ranked last; out ascending.
void qsa_select_blocks(const float* s, int64_t n_c, int64_t kb, std::vector<int32_t>& out);

// How a DeltaNet window treats committed state (see deltanet_state.h); Chunked: in place, a prompt window's
// rows in the chunked form (state/deltanet_chunked.h).
enum class DnMode { InPlace, Window, Partial, Chunked };
// Gated DeltaNet: x [T][H] (normed) -> out [T][H].
void deltanet_layer(const Model& m, const DeltaNetWeights& w, DeltaNetState& st, const float* x, int T, DnMode mode,
                    float* out);

// Sparse MoE + shared expert: x [T][H] (normed) -> out [T][H].
void moe_layer(const Model& m, const MoeWeights& w, const float* x, int T, float* out);

// Hyper-connections over the streams X [T][hc*H] (stream j = features j*H .. j*H+H-1):
// hc_mix gives the block input m [T][H] and, with an inject weight, the per-stream scales a [T][hc];
// hc_inject adds a_j * y to every stream j. The head mixer is hc_mix without inject.
void hc_mix(const Model& m, const HcWeights& w, const float* X, int T, float* mixed, float* scales);
void hc_inject(const Model& m, float* X, const float* y, const float* scales, int T);

// PLE: X [T][hc*H] (the streams entering the layer) -> out [T][hc*H] to be added to X. The n-gram context
// of row t is read from history (the committed tokens, position < pos0) and the window's tokens.
void ple_layer(const Model& m, const PleWeights& w, PleState& st, const float* X, const int32_t* tokens,
               const std::vector<int32_t>& history, int T, int64_t pos0, bool in_place, float* out);

// One forward window and the session state it reads and writes.
struct Window {
  const int32_t* tokens;
  int T;
  int64_t pos0;
  bool in_place;   // DeltaNet and PLE rows update committed state in the step (T = 1 and prompt windows)
  bool partial;    // row 0 updates DeltaNet state in the step, rows 1.. run on S_work
  bool last_only;  // logits of the last row only
  bool chunked;    // prompt windows (in place, T > 1): the DeltaNet recurrence in chunks (Session prefill)
};
// The DeltaNet mode of a window.
inline DnMode dn_mode(const Window& w) {
  if (w.in_place) return w.T > 1 && w.chunked ? DnMode::Chunked : DnMode::InPlace;
  return w.partial ? DnMode::Partial : DnMode::Window;
}
struct LayerStates {
  std::vector<KvCache>& kv;          // per attention layer (slot[il])
  std::vector<QsaState>& qsa;        // per attention layer (slot[il]); inactive on dense layers
  std::vector<DeltaNetState>& dn;    // per DeltaNet layer (slot[il])
  PleState& ple;
  const std::vector<int>& slot;
  const std::vector<int32_t>& history;  // committed tokens, [0, pos0)
};

// The graphs: embed tokens, every layer over T rows, final norm (or head mixer), output head.
// hidden [T][H]: the vector that enters the output head, per row; logits [T or 1][n_vocab].
void forward_qwen3next(const Model& m, LayerStates& s, const Window& w, float* logits, float* hidden);
void forward_qwen35moe(const Model& m, LayerStates& s, const Window& w, float* logits, float* hidden);
void forward_qwen4exp(const Model& m, LayerStates& s, const Window& w, float* logits, float* hidden);

}  // namespace strata
