"""MTP drafting: the checkpoint's own multi-token-prediction block proposes the next k tokens (k = 1..3).

The block runs in C++ (csrc/model/mtp.cpp, Session::mtp_draft): after each commit it consumes every newly
committed row's (post-final-norm hidden state, next token) pair into its own KV cache, then chains k greedy
drafts, each from its own output hidden state. Drafts only change speed: the window verifies them exactly.

"mtp"          MTP drafts, k chosen by a LengthController (acceptance per draft depth, C(T) online,
               the MTP time included in the window cost; a request starts from the acceptance the model's
               earlier requests saw, MtpCosts).
"mtp+suffix"   per window, the proposal with the higher expected throughput: the suffix-lookup continuation
               (when it has a match) or the MTP chain. Both are priced with one table of verify-window costs
               C(T) (every window, drafting excluded) plus, for MTP, its measured draft time per step; a
               match length whose suffix drafts were tried fewer than EXPLORE times is tried (that is how
               its acceptance gets measured).
"""
from __future__ import annotations

import time
from typing import Sequence

from ..config import GenerationConfig
from ..controller import DraftedCosts, LengthController, WindowCosts, expected_keep, per_model, window_costs
from . import register
from .suffix import SuffixDrafter

MAX_MTP_DRAFTS = 3
EXPLORE = 2  # suffix windows per match-length bucket before mtp+suffix trusts its acceptance estimate
# After a stretch without MTP drafts (declined, or suffix windows), the block re-syncs from the last RESYNC
# committed rows only: a probe then costs RESYNC rows of the block, not the whole stretch.
RESYNC = 8
# A request's controller starts from the drafts kept and rejected per depth by the earlier requests on the model,
# scaled to at most this many outcomes a depth: where MTP drafts paid, the first window drafts (not the first after
# probe_every = 32 plain ones), and the request's own outcomes soon outweigh them.
PRIOR_OUTCOMES = 8.0


class MtpCosts:
    """What MTP drafting costs and yields on one loaded model, shared by its requests (like window_costs(model)):
    the drafted windows' measured seconds (verify + drafting), the block's seconds per row, and the drafts kept and
    rejected per depth so far."""

    def __init__(self):
        self.drafted = WindowCosts()
        self.row_s: float | None = None
        self.kept = [0.0] * MAX_MTP_DRAFTS
        self.rejected = [0.0] * MAX_MTP_DRAFTS

    def record_row(self, seconds: float) -> None:
        self.row_s = seconds if self.row_s is None else self.row_s + 0.2 * (seconds - self.row_s)

    def record_outcome(self, offered: int, accepted: int) -> None:
        """A window of `offered` MTP drafts whose first `accepted` were kept (draft accepted + 1 was not)."""
        for i in range(min(accepted, offered)):
            self.kept[i] += 1
        if accepted < offered:
            self.rejected[accepted] += 1

    def prior(self) -> tuple[list[float], list[float]]:
        """(kept, rejected) per depth, each depth scaled to at most PRIOR_OUTCOMES outcomes."""
        kept, rej = [], []
        for a, r in zip(self.kept, self.rejected):
            f = min(1.0, PRIOR_OUTCOMES / (a + r)) if a + r > 0 else 0.0
            kept.append(a * f)
            rej.append(r * f)
        return kept, rej


def mtp_costs(model) -> MtpCosts:
    """The model's MtpCosts (created on first use; a fresh one without a model)."""
    return per_model(model, "_mtp_costs", MtpCosts)


class MtpDrafter:
    """A Proposer that needs an MTP-enabled session: generate_ids() calls bind(session) after prefill."""

    needs_mtp = True

    def __init__(self, cfg: GenerationConfig, suffix: SuffixDrafter | None = None, costs: WindowCosts | None = None,
                 mtp: MtpCosts | None = None):
        self.max_drafts = max(0, min(cfg.max_draft, MAX_MTP_DRAFTS))
        self.mtp = mtp if mtp is not None else MtpCosts()
        # verify-window costs of both drafters (the model's shared table when given)
        self.windows = LengthController(max_window=cfg.max_window, costs=costs if costs is not None else WindowCosts())
        # k: a window of k drafts costs C(k + 1) from that table plus the MTP block's work for it
        # (MTP's acceptance hardly moves within a request, unlike a suffix match's: probe 4x less often). In a
        # model's first request the first probe comes after 32 plain windows, not at the first window: on the GPU,
        # 8 alternated rounds in one call gave 1.35x plain that way against 1.17x with the early probe (later
        # requests start from the earlier ones' outcomes, MtpCosts.prior). Every 8 windows shorter
        # than k allows, one draft deeper (a request's first T = 4 windows once lost their second draft and T = 2
        # then held for the rest of it: depth 2 was never offered again).
        self.controller = LengthController(max_window=self.max_drafts + 1, fixed_t=min(cfg.fixed_t, self.max_drafts + 1),
                                           costs=DraftedCosts(self.windows.costs, self.drafting_s, self.mtp.drafted),
                                           probe_every=32, deep_probe_every=8)
        self.controller.seed(1, *self.mtp.prior())
        self.suffix = suffix
        self.session = None
        self._used = None          # "mtp" | "suffix" | None for the pending window
        self._draft_s = 0.0
        self.draft_s_total = 0.0
        self.offered_by_depth = [0] * self.max_drafts
        self.kept_by_depth = [0] * self.max_drafts
        self.mtp_windows = 0
        self.suffix_windows = 0

    def bind(self, session) -> None:
        if not session._core.mtp:
            raise ValueError("the MTP drafter needs a session created with mtp=True")
        self.session = session

    def propose(self, context: Sequence[int], max_drafts: int) -> list[int]:
        if self.session is None:
            raise RuntimeError("MtpDrafter.propose before bind(session)")
        t0 = time.perf_counter()
        self._used = None
        k = self.controller.choose(min(max_drafts, self.max_drafts), 1)
        if self.suffix is not None:
            sd = self.suffix.propose(context, max_drafts)
            if sd and self._prefer_suffix(sd, k):
                self._used = "suffix"
                self._draft_s = time.perf_counter() - t0
                return sd
            if sd:
                self.suffix.withdraw()
        drafts: list[int] = []
        # the block drafts from committed rows it has not consumed (none right after restoring a checkpoint
        # without MTP state, e.g. from a file: the next window's commit gives it one)
        if k > 0 and self.session.position > self.session._core.mtp_position:
            backlog = min(self.session.position - self.session._core.mtp_position, RESYNC)
            t1 = time.perf_counter()
            cold = self.session._core.cold_steps
            drafts = self.session.mtp_draft(int(context[-1]), k, max_backlog=RESYNC)
            row = (time.perf_counter() - t1) / (backlog + k)
            if self.session._core.cold_steps == cold:  # not a recording's warm-up (backend="cuda")
                self.mtp.record_row(row)
            self._used = "mtp"
        self._draft_s = time.perf_counter() - t0
        self.draft_s_total += self._draft_s
        return drafts

    def _prefer_suffix(self, sd: list[int], k: int) -> bool:
        """Whether the suffix proposal sd promises more tokens per second than k MTP drafts."""
        m = self.suffix._pending[0]
        ctl = self.suffix.controller
        if ctl is None or k == 0 or ctl.observations(m) < EXPLORE:
            return True
        e_s = expected_keep(ctl.acceptance(m, len(sd)))[-1] / self.windows.cost(len(sd) + 1)
        c_m = self.windows.cost(k + 1) + self.drafting_s(k + 1)
        e_m = expected_keep(self.controller.acceptance(1, k))[-1] / c_m
        return e_s >= e_m

    def drafting_s(self, T: int) -> float:
        """The MTP block's seconds for a window of T rows when drafting every window: its T - 1 drafts and
        the rows the window commits (at most T), which the next draft feeds through the block first."""
        return (self.mtp.row_s or 0.0) * (2 * T - 1)

    def observe(self, drafts: Sequence[int], accepted: int) -> None:
        if self._used == "suffix":
            self.suffix_windows += 1
            self.suffix.observe(drafts, accepted)
        elif self._used == "mtp":
            self.mtp_windows += 1
            self.controller.observe(1, len(drafts), accepted)
            self.mtp.record_outcome(len(drafts), accepted)
            for i in range(len(drafts)):
                self.offered_by_depth[i] += 1
                self.kept_by_depth[i] += 1 if i < accepted else 0

    def record_window(self, T: int, seconds: float) -> None:
        self.windows.record_window(T, seconds)
        if self._used == "suffix":
            self.suffix.record_window(T, seconds + self._draft_s)
        else:
            self.controller.record_window(T, seconds + self._draft_s)
        self._used = None

    def finish(self) -> None:
        """The request's end: the session is let go at once (the drafter sits in a reference cycle, through its
        controller's costs, that only the garbage collector frees; a backend session closed promptly lends its
        buffers and recorded steps to the next request: backend_forward.h BackendHold)."""
        self.session = None
        if self.suffix is not None:
            self.suffix.finish()

    def stats(self) -> dict:
        d = {
            "mtp_windows": self.mtp_windows,
            "mtp_draft_ms_total": round(self.draft_s_total * 1e3, 3),
            "mtp_acceptance_by_depth": [round(k / o, 3) if o else None
                                        for k, o in zip(self.kept_by_depth, self.offered_by_depth)],
            "mtp_offered_by_depth": self.offered_by_depth,
        }
        out = {"draft": d, "controller": self.controller.stats()}
        if self.suffix is not None:
            d["suffix_windows"] = self.suffix_windows
            sub = self.suffix.stats()
            out["suffix"] = sub.get("draft", sub)
        return out


@register("mtp")
def _mtp(*, model, cfg: GenerationConfig) -> MtpDrafter:
    if not model.has_mtp:
        raise ValueError(f"--draft mtp: {model.path} has no MTP block (blk.N.nextn.*)")
    return MtpDrafter(cfg, costs=window_costs(model), mtp=mtp_costs(model))


@register("mtp+suffix")
def _mtp_suffix(*, model, cfg: GenerationConfig) -> MtpDrafter:
    if not model.has_mtp:
        raise ValueError(f"--draft mtp+suffix: {model.path} has no MTP block (blk.N.nextn.*)")
    suffix = SuffixDrafter(cfg, LengthController(max_window=cfg.max_window, fixed_t=cfg.fixed_t))
    return MtpDrafter(cfg, suffix, costs=window_costs(model), mtp=mtp_costs(model))
