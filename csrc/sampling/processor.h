// Steering: the logit processors of one generation (engine spec 5) and the contract every one of them keeps.
//
// The processor contract (the restart invariant):
//   A processor's state at absolute position p depends only on the committed tokens at positions
//   origin..p, where origin is the position of the generation's first output token (Session::set_steering).
//   The state at origin-1 is the processor's initial state. So:
//   1. Session::sample advances a copy of the committed state through the window's input rows and applies
//      row i's penalty / mask to row i's logits (row i sees the state after input i).
//   2. commit(keep) steps the committed state over the kept inputs only; a rejected row leaves nothing
//      (the copy of step 1 is dropped). No state per position is stored: nothing needs truncating.
//   3. checkpoint() records the origin; restore() rescans the restored committed tokens [origin, position)
//      through the session's processors (memory and file checkpoints alike), so a restored conversation
//      continues exactly as if never interrupted.
//   4. Processors that keep no state (logit bias) and per-row token masks computed outside (the grammar
//      matcher, python/strata_py/steering/grammar.py, which keeps the same contract on its own side) trivially
//      keep it.
//
// Rollback contract of the session's steering state (a PhraseState value): the committed one is advanced only
// by commit() and rebuilt by restore() / load() / set_steering() from the committed tokens, never by sample().
//
// Per row, in this order (csrc/sampling/steer.cpp): logit bias -> repetition penalties (sampler.h) ->
// DRY (dry.h: a pure function of the row's history, no state) -> phrase penalties (phrase_automaton.h) -> the row's token mask (token_mask.h) -> choice. If the bans
// (phrase bans, -inf biases) leave no allowed token, the row falls back to the best token the mask allows
// with the bans lifted (finite penalties and biases kept), never a hang; a mask that allows nothing is an
// error naming the position.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "sampling/dry.h"
#include "sampling/logit_bias.h"
#include "sampling/phrase_automaton.h"

namespace strata {

// The immutable configuration of one generation's C++ processors; shareable between sessions.
struct Steering {
  int64_t n_vocab = 0;
  LogitBias bias;
  std::shared_ptr<const PhraseAutomaton> phrases;  // null: no phrase penalties
  std::shared_ptr<const DryPenalty> dry;           // null: no DRY penalty

  bool stateful() const { return phrases != nullptr; }
  bool dry_active() const { return dry && dry->active(); }
  PhraseState initial() const { return PhraseState{}; }
  PhraseState step(PhraseState s, int32_t token) const { return phrases ? phrases->step(s, token) : s; }
};

}  // namespace strata
