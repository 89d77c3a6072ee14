// The steered window finish (see steer.h, processor.h). One row, as numbered steps:
//   1. Edits: the row's sparse changes, each token's final value v = (logit + bias) - phrase penalty
//      (a phrase ban or a -inf bias gives -inf). They are deduplicated per token. A large static part of the
//      phrase penalties (many single-token phrases) is applied densely instead: v = logit - static[t].
//   2. Greedy without repetition penalties reads the row in place: the best allowed token among the
//      unedited ones (masked_argmax with the edited tokens' bits cleared) against the best edited one,
//      ties to the lower id: exactly argmax of the edited, masked row, without copying it.
//      Otherwise the row is copied, edited (bias, repetition penalties, DRY, phrase penalties), masked and sampled.
//   3. Fallback: if nothing is left, the row is finished again with the bans lifted (their finite parts kept);
//      if the mask still allows nothing, that is an error naming the position.
#include "sampling/steer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sampling/token_mask.h"
#include "util/common.h"

namespace strata {

namespace {

struct Edit {
  int32_t id;
  float bias;  // 0 if none
  float pen;   // phrase penalty, 0 if none, +inf = ban
};

// The row's edits, deduplicated: phrase penalties of `st`, then biases of tokens not already listed.
// With a dense static part (`stat`, phrase_automaton.h) the edits leave it out, but an edited token's
// penalty includes its static one (edited tokens are finished from their edit alone).
void row_edits(const Steering* steer, const PhraseState* st, const float* stat, std::vector<Edit>& edits) {
  edits.clear();
  if (!steer) return;
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<float> pens;
  thread_local std::vector<int32_t> slot;  // token -> index in edits + 1 (0: none), cleared after use
  if ((int64_t)slot.size() < steer->n_vocab) slot.assign(steer->n_vocab, 0);
  if (steer->phrases && st) {
    steer->phrases->penalties(*st, ids, pens, stat != nullptr);
    for (size_t j = 0; j < ids.size(); j++) {
      edits.push_back({ids[j], 0.f, stat ? std::max(stat[ids[j]], pens[j]) : pens[j]});
      slot[ids[j]] = (int32_t)edits.size();
    }
  }
  const LogitBias& b = steer->bias;
  for (size_t j = 0; j < b.ids.size(); j++) {
    const int32_t t = b.ids[j];
    if (slot[t]) edits[slot[t] - 1].bias = b.values[j];
    else edits.push_back({t, b.values[j], stat ? stat[t] : 0.f});
  }
  for (const Edit& e : edits) slot[e.id] = 0;
}

// The edited value of a token whose (penalised) logit is x; lift: bans count as nothing.
inline float edited(float x, const Edit& e, bool lift) {
  if (e.bias != 0.f && !(lift && e.bias == -INFINITY)) x = x + e.bias;
  if (e.pen != 0.f) {
    if (std::isinf(e.pen)) x = lift ? x : -INFINITY;
    else x = x - e.pen;
  }
  return x;
}

inline bool allowed(const uint32_t* mask, int32_t t) { return !mask || ((mask[t >> 5] >> (t & 31)) & 1u); }

// `stat` with its bans lifted (the fallback); null stays null.
const float* lifted(const float* stat, int64_t V) {
  if (!stat) return nullptr;
  thread_local std::vector<float> l;
  l.assign(stat, stat + V);
  for (float& x : l)
    if (std::isinf(x)) x = 0.f;
  return l.data();
}

int32_t greedy_in_place(const float* row, int64_t V, const uint32_t* mask, const float* stat,
                        const std::vector<Edit>& edits, bool lift) {
  const float* sub = stat && lift ? lifted(stat, V) : stat;
  int32_t bi = -1;
  if (!mask && !sub) {  // the plain argmax, when no edited token wins it, is the best unedited token
    bi = argmax(row, V);
    for (const Edit& e : edits)
      if (e.id == bi) bi = -2;
  }
  if (bi == -2 || mask || sub) {  // the best allowed unedited token: the edited ones' bits cleared
    thread_local std::vector<uint32_t> m2;
    const int64_t W = mask_words(V);
    if (mask) m2.assign(mask, mask + W);
    else m2.assign(W, 0xffffffffu);
    for (const Edit& e : edits) m2[e.id >> 5] &= ~(1u << (e.id & 31));
    bi = sub ? masked_argmax_sub(row, sub, V, m2.data()) : masked_argmax(row, V, m2.data());
  }
  float bv = bi < 0 ? -INFINITY : sub ? row[bi] - sub[bi] : row[bi];
  for (const Edit& e : edits) {
    if (!allowed(mask, e.id)) continue;
    const float v = edited(row[e.id], e, lift);
    if (v > bv || (v == bv && bi >= 0 && e.id < bi)) {
      bv = v;
      bi = e.id;
    }
  }
  return bi;
}

void edit_copy(const float* src, float* row, int64_t V, const SamplingParams& p, const float* stat,
               const std::vector<Edit>& edits, const uint32_t* mask, const std::vector<int32_t>& hist,
               const DryPenalty* dry, const std::vector<int32_t>& dry_hist, bool lift) {
  std::copy(src, src + V, row);
  for (const Edit& e : edits)
    if (e.bias != 0.f && !(lift && e.bias == -INFINITY)) row[e.id] = row[e.id] + e.bias;
  if (p.penalties_active()) apply_penalties(row, V, p, hist.data(), (int64_t)hist.size());
  if (dry) apply_dry(row, V, *dry, dry_hist.data(), (int64_t)dry_hist.size());
  if (stat) {  // the dense static part; edited tokens are then set from their value before it
    thread_local std::vector<float> before;
    before.resize(edits.size());
    for (size_t j = 0; j < edits.size(); j++) before[j] = row[edits[j].id];
    const float* sub = lift ? lifted(stat, V) : stat;
    for (int64_t t = 0; t < V; t++) row[t] = row[t] - sub[t];
    for (size_t j = 0; j < edits.size(); j++) row[edits[j].id] = before[j];
  }
  for (const Edit& e : edits) {
    if (e.pen == 0.f) continue;
    if (std::isinf(e.pen)) row[e.id] = lift ? row[e.id] : -INFINITY;
    else row[e.id] = row[e.id] - e.pen;
  }
  if (mask) apply_token_mask(row, V, mask);
}

[[noreturn]] void nothing_allowed(int64_t pos, int64_t V, bool masked) {
  fail<std::runtime_error>("no token is allowed at position ", pos, ": ",
                           masked ? "the grammar's token mask (with the logit bias) excludes"
                                  : "the logit bias excludes",
                           " every one of the ", V, " tokens");
}

}  // namespace

int steer_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const SteerRows& sr,
               const int32_t* committed, int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out,
               bool verified_prefix) {
  STRATA_CHECK(T >= 0, "steer_rows: T must be >= 0, got ", T);
  if (T == 0) return 0;
  STRATA_CHECK(logits && inputs && out, "steer_rows: logits/inputs/out is null");
  STRATA_CHECK(!sr.steer || sr.steer->n_vocab == n_vocab, "steer_rows: the steering was built for ",
               sr.steer ? sr.steer->n_vocab : 0, " tokens, the model has ", n_vocab);
  p.validate();
  const int64_t W = mask_words(n_vocab);
  const bool pen = p.penalties_active();
  const DryPenalty* dry = sr.steer && sr.steer->dry_active() ? sr.steer->dry.get() : nullptr;
  thread_local std::vector<Edit> edits;
  thread_local std::vector<float> row;
  thread_local std::vector<int32_t> hist, dry_hist;
  for (int i = 0; i < T; i++) {
    const float* src = logits + (int64_t)i * n_vocab;
    const uint32_t* mask = sr.masks ? sr.masks + (int64_t)i * W : nullptr;
    const int64_t pos = pos0 + i + 1;
    const PhraseState* st = sr.states ? sr.states + i : nullptr;
    const float* stat = st && sr.steer && sr.steer->phrases ? sr.steer->phrases->static_penalties(st->boundary) : nullptr;
    row_edits(sr.steer, st, stat, edits);
    PickTrace* trace = sr.traces ? sr.traces + i : nullptr;
    if (!pen && !dry && p.temperature == 0.f) {
      int32_t t = greedy_in_place(src, n_vocab, mask, stat, edits, false);
      if (t < 0) t = greedy_in_place(src, n_vocab, mask, stat, edits, true);
      if (t < 0) nothing_allowed(pos, n_vocab, mask != nullptr);
      out[i] = t;
      if (trace) {  // the argmax stands under any mask that allows it
        trace->kind = PickTrace::kCheck;
        trace->ids.assign(1, t);
        trace->keys.clear();
        trace->pos = pos;
        trace->p = p;
      }
    } else {
      row.resize((size_t)n_vocab);
      if (pen) row_history(committed, n_committed, inputs, i, p.penalty_last_n, hist);
      if (dry) row_history(committed, n_committed, inputs, i, (int32_t)dry->window(n_committed + i + 1), dry_hist);
      edit_copy(src, row.data(), n_vocab, p, stat, edits, mask, hist, dry, dry_hist, false);
      if (argmax(row.data(), n_vocab) < 0) {
        edit_copy(src, row.data(), n_vocab, p, stat, edits, mask, hist, dry, dry_hist, true);
        if (argmax(row.data(), n_vocab) < 0) nothing_allowed(pos, n_vocab, mask != nullptr);
      }
      out[i] = pick_token(row.data(), n_vocab, p, pos, trace, sr.trace_cap);
    }
    if (verified_prefix && i + 1 < T && out[i] != inputs[i + 1]) return i + 1;
  }
  return T;
}

}  // namespace strata
