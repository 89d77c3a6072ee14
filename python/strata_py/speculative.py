"""The decode loop: one C++ window per iteration, plain (T = 1) or speculative (T = 1 + drafts).

Vocabulary (engine spec 2.3): a window's inputs are the **root** (the last emitted, not yet processed token)
and the **drafts**. Output row i is the token chosen for position pos0+i+1 by the same processors and the
same position-keyed RNG that serial decoding uses, so:
  1. run([root] + drafts)        all rows in one forward pass
  2. out = sample()              per-row processors + choice (greedy argmax, or sampling keyed by position)
  3. accept: walk i = 0..T-2 while out[i] == inputs[i+1]; first mismatch at i -> keep = i+1.
     All match -> keep = T and out[T-1] is the **bonus** token.
     An end-of-generation token in out[0..keep-1] cuts the prefix right after it.
  4. commit(keep); emit out[0..keep-1]; the last emitted token is the next root.
For a deterministic draft this is the Leviathan/Chen rule with a point-mass draft: every emitted token is
exactly the token serial decoding would have produced, greedy or sampled (same seed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from .config import GenerationConfig


class Proposer(Protocol):
    """What the loop needs from a drafter: drafts for the current context, and the outcome."""

    def propose(self, context: Sequence[int], max_drafts: int) -> list[int]: ...

    def observe(self, drafts: Sequence[int], accepted: int) -> None: ...


@dataclass
class LoopStats:
    """Counters of one request (engine spec 8); times in seconds."""
    prompt_tokens: int = 0
    cached_tokens: int = 0     # prompt tokens the session already held (prefix reuse): not prefilled
    prefill_s: float = 0.0
    generated: int = 0
    decode_s: float = 0.0
    windows: int = 0
    drafted: int = 0
    accepted: int = 0
    t_hist: dict = field(default_factory=dict)
    window_ms: list = field(default_factory=list)
    window_tokens: list = field(default_factory=list)  # tokens emitted by each window
    step_ms: list = field(default_factory=list)        # each window including its drafting
    cold_windows: int = 0  # windows (with their drafting) during which the GPU ran or recorded a step cold
    cold_ms: float = 0.0   # their step_ms
    stop: str = ""

    WARMUP_WINDOWS = 4  # first-touch of buffers, page-ins and cold caches land here (engine spec 8)

    def as_dict(self) -> dict:
        wm = sorted(self.window_ms)
        pct = (lambda q: wm[min(len(wm) - 1, int(q * len(wm)))] if wm else 0.0)
        w = self.WARMUP_WINDOWS
        steady_ms, steady_tok = sum(self.step_ms[w:]), sum(self.window_tokens[w:])
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_s": self.prefill_s,
            "prefill_tok_s": self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0,
            "generated_tokens": self.generated,
            "decode_s": self.decode_s,
            "decode_tok_s": self.generated / self.decode_s if self.decode_s > 0 else 0.0,
            "windows": self.windows,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "e_keep": self.generated / self.windows if self.windows else 0.0,
            "t_hist": {str(k): v for k, v in sorted(self.t_hist.items())},
            "window_ms_mean": sum(wm) / len(wm) if wm else 0.0,
            "window_ms_p50": pct(0.5),
            "window_ms_p99": pct(0.99),
            "warmup_ms": sum(self.step_ms[:w]),
            "steady_tok_s": steady_tok / steady_ms * 1e3 if steady_ms > 0 else 0.0,
            "cold_windows": self.cold_windows,
            "cold_ms": self.cold_ms,
            "stop": self.stop,
        }


def accept(inputs: Sequence[int], out: Sequence[int], eog: set[int]) -> int:
    """How many rows to keep (= tokens to emit): the verified prefix, cut after an end-of-generation token. out may
    hold only the verified prefix (run_sample's verified_prefix: its last row is the first that is not the next
    input, or the window's last)."""
    keep = min(len(inputs), len(out))
    for i in range(keep - 1):
        if out[i] != inputs[i + 1]:
            keep = i + 1
            break
    for i in range(keep):
        if out[i] in eog:
            return i + 1
    return keep


def prefill(session, ids: Sequence[int], chunk: int = 512) -> None:
    """Commit `ids` in prompt windows of at most `chunk` rows (only the last row's logits are formed)."""
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        session.run(part, last_only=True)
        session.commit(len(part))


# Decoding under a grammar finishes each row without a mask, then checks the row's candidates with the grammar
# and computes a full mask only for a row that needs it (same tokens as always masking: GrammarMatcher.fix_rows).
# A module constant, not an option: the benches and tests turn it off to compare the two.
LAZY_MASKS = True
# A sampled row with more candidates than this (sampler.h PickTrace; e.g. min-p 0 and no top-k) takes its full
# mask: checking them one by one would cost more.
LAZY_CAP = 16
# Under a grammar, the Python step between two forwards (the checks, accept, commit) takes ~30-60 us at T = 1, past
# the ~50 us an idle pool worker polls before it sleeps (threads.h kSpinUs); waking it cost the next forward
# ~50-60 us on the 2-core VM (docs/BENCHMARKS.md, "Steered decoding"). So each window asks the workers to keep
# polling this long after its forward (ThreadPool::linger); a longer step only brings the wake-up back.
GRAMMAR_LINGER_US = 300.0
# A window's rows are finished (processors + choice) only up to the first whose token is not the next input
# (run_sample's verified_prefix): the rows it keeps, the same tokens. The rest would be finished and thrown away:
# ~28 us a row under the default sampling (DRY) on a 2-core VM, a T = 16 window's 0.45 ms, as long as a GPU step.
# A module constant, not an option: tests/test_exactness.py turns it off to check rules that read every row.
VERIFIED_PREFIX = True


def overlap_masks(model) -> bool:
    """Whether a window's grammar masks are computed while its forward runs: only when a core is free for
    them (on a machine whose cores all run the forward, the two would only slow each other)."""
    import os

    return (os.cpu_count() or 1) > model.threads


def decode(session, root: int, cfg: GenerationConfig, eog: set[int], stats: LoopStats,
           proposer: Proposer | None = None, choose_drafts: Callable[[int], int] | None = None, *,
           origin: int | None = None, steering=None,
           on_commit: Callable[[list[int], int], None] | None = None) -> Iterator[int]:
    """Yield emitted token ids until max_tokens, an end-of-generation token, a stop string, or the context is full.

    choose_drafts(available) -> how many drafts to ask for (the length controller); default: all available.
    Steering (cfg.logit_bias, ban_phrases, json_schema / regex / grammar, stop; steering/__init__.py) applies
    from `origin`, the position of the generation's first output token: None starts a new generation right
    after `root` (session.position + 1); to continue a generation on a restored session pass
    origin=session.steer_origin (the processors then rescan the committed output, exactly as uninterrupted).
    `steering`: a prebuilt steering.Steering for cfg (else built here).
    on_commit(out, keep): after each commit, before out[:keep] is yielded, while the window's logits are still
    readable (Session.logprobs: the server's logprobs).
    """
    from .model import sampling_params  # (imports the C++ core; this module stays importable without it)
    from .steering import Steering, TextStream

    max_window = session.max_window
    params = sampling_params(cfg)  # built once per request
    core = session._core
    record = getattr(proposer, "record_window", None)  # optional: window cost for a length controller
    # --- steering (issue 15)
    origin = session.position + 1 if origin is None else origin
    steer = steering if steering is not None else Steering(session.model, cfg, max_window)
    steer.attach(session, origin)
    stops = TextStream(session.model.tokenizer, cfg.stop) if cfg.stop else None
    if stops is not None:  # a resumed generation: the output so far may hold the start of a stop string
        for t in session.tokens[origin:] + ([root] if origin <= session.position else []):
            stops.push(t)
        if stops.stopped:
            stats.stop = "stop"
            return
    overlap = steer.grammar is not None and overlap_masks(session.model)
    lazy = LAZY_MASKS  # full masks only for rows whose candidates the grammar refuses (fix_rows)
    linger = GRAMMAR_LINGER_US if steer.grammar is not None else 0.0
    # ---
    context = list(session.tokens) + [root]
    while stats.generated < cfg.max_tokens:
        room = min(cfg.max_tokens - stats.generated, session.n_ctx - session.position, max_window)
        if room < 1:
            stats.stop = "context"
            return
        t_start = time.perf_counter()  # decode time includes drafting
        cold = core.cold_steps  # a window (or its draft) that records a step of the GPU is no measure of C(T)
        drafts: list[int] = []
        if proposer is not None and room > 1:
            want = room - 1 if choose_drafts is None else min(room - 1, choose_drafts(room - 1))
            if want > 0:
                drafts = list(proposer.propose(context, want))[:want]
        inputs = [root] + drafts
        t0 = time.perf_counter()
        if steer.grammar is not None and lazy:  # check each row's candidates, mask only where needed
            out, cands, complete = core.run_sample_traced(np.asarray(inputs, dtype=np.int32), params, LAZY_CAP,
                                                          linger)
            out = steer.grammar.fix_rows(inputs, session.position, out, cands, complete,
                                         lambda i, mask: core.sample_row(params, i, mask), core.repick)
        else:
            masks = None
            if steer.grammar is not None:  # computed during the forward (a callable) or before it
                masks = (steer.mask_fn if overlap else steer.masks)(inputs, session.position)
            out = core.run_sample(np.asarray(inputs, dtype=np.int32), params, masks, linger, VERIFIED_PREFIX).tolist()
        keep = accept(inputs, out, eog)
        stopped = False
        if stops is not None:  # a stop string cuts the prefix right after the token completing it
            for j in range(keep):
                stops.push(out[j])
                if stops.stopped:
                    keep, stopped = j + 1, True
                    break
        core.commit(keep)
        steer.commit(keep)
        if on_commit is not None:
            on_commit(out, keep)
        t1 = time.perf_counter()
        dt = t1 - t0
        stats.decode_s += t1 - t_start
        stats.windows += 1
        stats.window_ms.append(dt * 1e3)
        stats.window_tokens.append(keep)
        stats.step_ms.append((t1 - t_start) * 1e3)
        stats.t_hist[len(inputs)] = stats.t_hist.get(len(inputs), 0) + 1
        stats.drafted += len(drafts)
        stats.accepted += keep - 1
        if proposer is not None and drafts:
            proposer.observe(drafts, keep - 1)
        if core.cold_steps == cold:
            if record is not None:
                record(len(inputs), dt)
        else:
            stats.cold_windows += 1
            stats.cold_ms += (t1 - t_start) * 1e3
        for i in range(keep):
            tok = out[i]
            stats.generated += 1
            yield tok
            if tok in eog and cfg.stop_at_eos:
                stats.stop = "eog"
                return
        if stopped:
            stats.stop = "stop"
            return
        context.extend(out[:keep])
        root = out[keep - 1]
    stats.stop = "max_tokens"
