"""Suffix-lookup drafter (model-free): propose the continuation of the longest earlier occurrence of the
current suffix in the request's own tokens (prompt + output), else in earlier requests' outputs.

Registered names:
  suffix  every match's continuation, up to max_draft drafts (the loop still bounds T)
  auto    the same lookup, with the length controller (controller.py) choosing how many drafts pay

The C++ index (csrc/drafting/suffix_index.h) is fed incrementally: the loop passes the full context each
time, the drafter appends only the tail it has not indexed yet. The process-wide global index is off
unless cfg.extra["global_index_tokens"] > 0 (its budget in tokens); a finished request's output is added
to it by finish().
"""
from __future__ import annotations

import time
from typing import Sequence

from .. import _core
from ..config import GenerationConfig
from ..controller import BUCKET_EDGES, LengthController, bucket_label, bucket_of, window_costs
from . import register

MAX_MATCH = 64       # backward extension bound (tokens)
MAX_CANDIDATES = 64  # most recent occurrences visited per lookup

_GLOBAL: dict[tuple[int, int], "_core.GlobalSuffixIndex"] = {}


def global_index(capacity_tokens: int, min_match: int) -> "_core.GlobalSuffixIndex":
    """The process-wide index of earlier outputs for this budget and minimum match (created on first use)."""
    key = (capacity_tokens, min_match)
    if key not in _GLOBAL:
        _GLOBAL[key] = _core.GlobalSuffixIndex(capacity_tokens, min_match=min_match, max_match=MAX_MATCH,
                                               max_candidates=MAX_CANDIDATES)
    return _GLOBAL[key]


class SuffixDrafter:
    """A Proposer over one request: propose(context, max_drafts) / observe(drafts, accepted)."""

    def __init__(self, cfg: GenerationConfig, controller: LengthController | None = None, *,
                 global_tokens: int = 0):
        self.max_draft = cfg.max_draft
        self.fixed_t = cfg.fixed_t
        self.controller = controller
        self.index = _core.SuffixIndex(min_match=cfg.min_match, max_match=MAX_MATCH, max_candidates=MAX_CANDIDATES)
        self.global_index = global_index(global_tokens, cfg.min_match) if global_tokens > 0 else None
        self._last = None         # last indexed token (detects a context that is not our continuation)
        self._prompt_len = None   # context length at the first proposal: what follows is output
        self._pending = (0, 0)    # (match length, drafts) of the last proposal, for observe()
        self._propose_s = 0.0
        self._finished = False
        # statistics (engine spec 8)
        self.lookups = 0
        self.covered = 0
        self.global_hits = 0
        self.match_hist: dict[int, int] = {}
        self.found = 0       # continuation tokens the lookups returned
        self.offered = 0     # drafts put into windows
        self.kept = 0        # drafts accepted
        self.draft_windows = 0

    # ---------------------------------------------------------------------- Proposer protocol
    def propose(self, context: Sequence[int], max_drafts: int) -> list[int]:
        t0 = time.perf_counter()
        self._sync(context)
        limit = min(max_drafts, self.max_draft)
        self._pending = (0, 0)
        if limit <= 0:
            return []
        m = self.index.lookup(limit)
        if not m and self.global_index is not None:
            m = self.global_index.lookup(list(context[-MAX_MATCH:]), limit)
            self.global_hits += bool(m)
        self.lookups += 1
        found = list(m.drafts) if m else []
        if m:
            self.covered += 1
            b = bucket_of(m.match_length)
            self.match_hist[b] = self.match_hist.get(b, 0) + 1
            self.found += len(found)
        if self.controller is not None and (found or self.fixed_t):
            d = self.controller.choose(limit if self.fixed_t else len(found), m.match_length if m else 0)
        elif self.fixed_t:
            d = min(self.fixed_t - 1, limit)
        else:
            d = len(found)
        drafts = found[:d]
        if len(drafts) < d:  # fixed T: pad so the window really has T rows (cost experiments)
            drafts += [drafts[-1] if drafts else int(context[-1])] * (d - len(drafts))
        self._pending = (m.match_length if m else 0, len(drafts))
        self.offered += len(drafts)
        self._propose_s = time.perf_counter() - t0
        return drafts

    def withdraw(self) -> None:
        """The last proposal was not used (a combining drafter chose another): forget it."""
        self.offered -= self._pending[1]
        self._pending = (0, 0)
        self._propose_s = 0.0

    def observe(self, drafts: Sequence[int], accepted: int) -> None:
        self.kept += accepted
        self.draft_windows += 1
        if self.controller is not None:
            self.controller.observe(self._pending[0], len(drafts), accepted)

    def record_window(self, T: int, seconds: float) -> None:
        """Window cost measured by the decode loop; the lookup time of that window is added here."""
        if self.controller is not None:
            self.controller.record_window(T, seconds + self._propose_s)
        self._propose_s = 0.0

    def finish(self) -> None:
        """End of the request: add its output (as indexed) to the global index, once."""
        if self._finished or self.global_index is None or self._prompt_len is None:
            return
        self._finished = True
        out = list(self.index.tokens)[self._prompt_len:]
        if out:
            self.global_index.add(out)

    # ---------------------------------------------------------------------- internals
    def _sync(self, context: Sequence[int]) -> None:
        """Index the part of `context` not indexed yet; start over if it is not a continuation."""
        k = len(self.index)
        if len(context) < k or (k and int(context[k - 1]) != self._last):
            self.index.clear()
            k = 0
            self._prompt_len = None
        if self._prompt_len is None:
            self._prompt_len = len(context)
        if len(context) > k:
            tail = [int(t) for t in context[k:]]
            self.index.extend(tail)
            self._last = tail[-1]

    def stats(self) -> dict:
        labels = {b: bucket_label(b) for b in range(len(BUCKET_EDGES))}
        d = {
            "drafter": "auto" if self.controller is not None else "suffix",
            "lookups": self.lookups,
            "coverage": round(self.covered / self.lookups, 4) if self.lookups else 0.0,
            "global_hits": self.global_hits,
            "match_len_hist": {labels[b]: n for b, n in sorted(self.match_hist.items())},
            "found": self.found,
            "offered": self.offered,
            "kept": self.kept,
            "kept_per_offered": round(self.kept / self.offered, 4) if self.offered else 0.0,
            "e_keep_when_drafting": round(1 + self.kept / self.draft_windows, 4) if self.draft_windows else 0.0,
        }
        out = {"draft": d}
        if self.controller is not None:
            out["controller"] = self.controller.stats()
        return out


def _global_tokens(cfg: GenerationConfig) -> int:
    n = int(cfg.extra.get("global_index_tokens", 0)) if cfg.extra else 0
    if n < 0:
        raise ValueError(f"bad option extra['global_index_tokens']={n}: must be >= 0 (0 = off)")
    return n


@register("suffix")
def _suffix(*, model, cfg: GenerationConfig) -> SuffixDrafter:
    return SuffixDrafter(cfg, None, global_tokens=_global_tokens(cfg))


@register("auto")
def _auto(*, model, cfg: GenerationConfig) -> SuffixDrafter:
    return SuffixDrafter(cfg, LengthController(max_window=cfg.max_window, fixed_t=cfg.fixed_t, costs=window_costs(model)),
                         global_tokens=_global_tokens(cfg))
