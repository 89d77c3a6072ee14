"""One decoding timeline per loaded model: its session, its checkpoint ring, and a FIFO of requests that one
worker thread serves one at a time, each to its end (the server's and the chat's engine).

Why one timeline: a session is one sequence of committed tokens; serving requests one after the other from
exact checkpoints keeps every answer equal to what a fresh process would give it, and keeps the memory of one
KV cache. Fairness is arrival order; the queue is bounded (QueueFull past max_queue waiting requests).

Serving one request (the worker, `_serve`):
  1. Skip it if it was cancelled while it waited.
  2. Pick the longest exact prefix of its prompt (all but the last token, which is the first window's root):
     the live session (what the last request left), or the ring's longest checkpoint whose tokens the prompt
     starts with. Restore it, or reset to position 0 when nothing matches. No other request's state is ever
     visible: the state restored holds exactly tokens of this prompt.
  3. Prefill the rest in prompt windows, checkpointing at message boundaries (`boundaries`, at least
     `checkpoint_gap` tokens apart) and at the end of the prompt. Cancellation is checked between windows.
  4. Decode (generate_ids: plain or speculative, same tokens), emitting one Token event per token; a
     cancelled request stops after the token in hand: every window is committed before its tokens are
     yielded, so the session is consistent wherever it stops.
  5. Checkpoint the end of the answer (prompt + every committed answer token), emit Done.
  Any error resets the session (state never half-updated) and emits Failed; checkpoints are immutable.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..config import GenerationConfig
from ..generate import generate_ids, make_proposer
from ..speculative import LoopStats, prefill
from ..steering import Steering
from .metrics import Metrics
from .prefix_cache import PrefixCache, load_dir, save_dir
from .token_text import Token, TokenText

PROMPT_WINDOW = 512      # rows per prompt window (speculative.prefill's chunk)
MAX_BOUNDARY_CHECKPOINTS = 4


class QueueFull(RuntimeError):
    """The timeline's queue holds max_queue waiting requests already (the server answers 503)."""


class Closed(RuntimeError):
    """The timeline is shutting down."""


# ---------------------------------------------------------------------------------------------- events
@dataclass
class Started:
    prompt_tokens: int
    cached_tokens: int     # restored from a checkpoint (or kept live), not computed
    queue_s: float
    prefill_s: float


@dataclass
class Done:
    finish_reason: str     # "stop" (end-of-generation token, stop string) | "length" (max_tokens, context) | "cancelled"
    completion_tokens: int
    stats: dict


@dataclass
class Failed:
    error: BaseException


@dataclass
class Request:
    """One generation on the timeline; events go to emit(event), from the worker thread."""
    ids: list
    cfg: GenerationConfig
    emit: Callable[[object], None]
    boundaries: list = field(default_factory=list)   # token counts at message starts: checkpoint candidates
    logprobs: int | None = None                      # None: off; n >= 0: log-probabilities + the top n
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()


def default_ctx(model, ctx: int | None) -> int:
    n = min(model.n_ctx_train, 32768) if ctx is None else ctx
    if n > model.n_ctx_train:
        raise ValueError(f"bad option ctx={n}: {model.path.name} was trained for {model.n_ctx_train} tokens")
    return n


class Timeline:
    def __init__(self, model, *, cfg: GenerationConfig, ctx: int | None = None, prompt_cache_mib: int = 1024,
                 checkpoint_gap: int = 256, max_queue: int = 16, slot_save: str | None = None,
                 metrics: Metrics | None = None):
        self.model = model
        self.cfg = cfg.validate()
        self.n_ctx = default_ctx(model, ctx)
        self.session = model.session(n_ctx=self.n_ctx, max_window=cfg.max_window, mtp=model.has_mtp)
        self.cache = PrefixCache(prompt_cache_mib * 2**20)
        self.checkpoint_gap = checkpoint_gap
        self.max_queue = max_queue
        self.slot_save = slot_save
        self.metrics = metrics or Metrics()
        self.metrics.set("strata_prefix_cache_budget_bytes", self.cache.budget)
        self.refused_files: list[str] = []
        if slot_save:
            _, self.refused_files = load_dir(self.cache, self.session, slot_save)
        self._queue: deque[Request] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._running: Request | None = None
        self._totals = {"prefill_tokens": 0, "prefill_s": 0.0, "generated": 0, "decode_s": 0.0, "drafted": 0,
                        "accepted": 0}
        self._update_cache_gauges()
        self._thread = threading.Thread(target=self._loop, name="strata-timeline", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ public
    def submit(self, req: Request) -> None:
        with self._cv:
            if self._closing:
                raise Closed("the server is shutting down")
            # at most max_queue requests wait behind the one being served; while none is (the worker between
            # two), the first of the queue is as good as served
            waiting = len(self._queue) - (0 if self._running is not None else 1)
            if waiting >= self.max_queue:
                self.metrics.inc("strata_requests_rejected_total")
                raise QueueFull(f"{len(self._queue)} requests are waiting already (--max-queue {self.max_queue})")
            self._queue.append(req)
            self.metrics.set("strata_queue_length", len(self._queue))
            self._cv.notify()

    @property
    def queue_length(self) -> int:
        with self._cv:
            return len(self._queue)

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests, fail the waiting ones, cancel the running one, then write the ring (--slot-save)."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            waiting = list(self._queue)
            self._queue.clear()
            if self._running is not None:
                self._running.cancel()
            self._cv.notify_all()
        for r in waiting:
            r.emit(Failed(Closed("the server is shutting down")))
        self._thread.join(timeout)
        if self.slot_save and not self._thread.is_alive():
            save_dir(self.cache, self.session, self.slot_save)

    def save_live(self, path) -> int:
        """Write the live session (the end of the last request) to a file; only while no request runs.
        Returns the tokens it holds."""
        with self._cv:
            self._idle_or_refuse("save_live")
            self.session.save(path)
            return self.session.position

    def load_file(self, path) -> int:
        """Read a session file into the checkpoint ring (a later prompt that starts with its tokens reuses it);
        only while no request runs. Returns the tokens it holds; ValueError if this model refuses the file."""
        with self._cv:
            self._idle_or_refuse("load_file")
            try:
                self.session.load(path)
                n = self.session.position
                if not self.cache.add(self.session.tokens, self.session.checkpoint(), "file"):
                    raise ValueError(f"{path}: the state ({n} tokens) is larger than --prompt-cache-mib")
                return n
            finally:
                self.session.reset()

    def _idle_or_refuse(self, what: str, timeout: float = 5.0) -> None:
        """(holding _cv) Wait a little for the worker to finish the request it is closing; else refuse."""
        if not self._cv.wait_for(lambda: self._running is None and not self._queue, timeout):
            raise RuntimeError(f"{what}: a request is running or waiting on this timeline")

    # ------------------------------------------------------------------------------------------ worker
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if self._closing:
                    return
                req = self._queue.popleft()
                self._running = req
                self.metrics.set("strata_queue_length", len(self._queue))
            try:
                final = self._serve(req)
            except BaseException as e:  # noqa: BLE001  (the worker must survive anything a request does)
                self.session.reset()  # 'Any error resets the session'
                final = Failed(e)
            with self._cv:
                self._running = None
                self._cv.notify_all()
            self._update_cache_gauges()
            # the request's last event goes out once it no longer holds the timeline: a client that sends its next
            # request on seeing it finds that slot free (submit's queue bound)
            req.emit(final)

    def _serve(self, req: Request) -> Done:
        """Run one request, emitting its Started and Token events; returns its Done (emitted by _loop)."""
        t_start = time.perf_counter()
        queue_s = t_start - req.arrived
        self.metrics.observe("strata_queue_wait_seconds", queue_s)
        if req.cancelled.is_set():  # 1
            return Done("cancelled", 0, {})
        ids, s = list(req.ids), self.session
        s._core.set_steering(None, 0)  # the last request's processors: not this one's (decode attaches its own)
        if not ids:
            raise ValueError("empty prompt (give at least one token)")
        if len(ids) > self.n_ctx:
            raise ValueError(f"prompt of {len(ids)} tokens exceeds the context of {self.n_ctx} tokens")
        # the request's processors, its constraint compiled now: a bad one fails before any work is done
        steer = Steering(self.model, req.cfg, s.max_window)
        held = self._take_prefix(ids)  # 2
        cached = held
        if not self._prefill(req, ids, held):  # 3 (the prefix it reused is still reported)
            return Done("cancelled", 0, {"cached_tokens": cached})
        prefill_s = time.perf_counter() - t_start
        req.emit(Started(len(ids), cached, queue_s, prefill_s))
        stats = LoopStats()
        proposer = make_proposer(self.model, req.cfg)
        tok = self.model.tokenizer
        text = TokenText(tok, req.cfg.stop)  # Token events with the text each releases; stop strings never shown
        eog = set(tok.eog_ids) if req.cfg.stop_at_eos else set()
        pending_lp: deque = deque()

        def on_commit(out, keep):
            if req.logprobs is not None:
                lp, top_ids, top_lp = s.logprobs(out[:keep], req.logprobs)
                for i in range(keep):
                    pending_lp.append((float(lp[i]), [(int(a), float(b)) for a, b in zip(top_ids[i], top_lp[i])]))

        finish, first = None, True
        gen = generate_ids(self.model, ids, req.cfg, stats=stats, session=s, proposer=proposer, on_commit=on_commit,
                           steering=steer)
        try:
            for t in gen:  # 4
                lp, top = pending_lp.popleft() if pending_lp else (None, None)
                if first:
                    self.metrics.observe("strata_time_to_first_token_seconds", time.perf_counter() - req.arrived)
                    first = False
                if t in eog:
                    finish = "stop"
                    break
                for ev in text.push(t, lp, top):
                    req.emit(ev)
                if req.cancelled.is_set():
                    finish = "cancelled"
                    break
        finally:
            gen.close()
        for ev in text.flush():
            req.emit(ev)
        if finish is None:
            finish = "stop" if stats.stop in ("eog", "stop") else "length"
        if self.cache.budget and s.position > len(ids) - 1:  # 5
            self.cache.add(s.tokens, s.checkpoint(), "answer")
        sd = stats.as_dict()
        if hasattr(proposer, "stats"):
            sd.update(proposer.stats())
        sd["cached_tokens"] = cached
        sd["prefill_s"] = prefill_s
        self._account(stats, len(ids) - cached, prefill_s, finish)
        return Done(finish, stats.generated, sd)

    # ------------------------------------------------------------------------------------------ steps
    def _take_prefix(self, ids: list) -> int:
        """Step 2: put the session at the longest exact prefix of ids[:-1] we hold; returns its length."""
        s, limit = self.session, len(ids) - 1
        live = s.position
        if live and (not self.cache.budget or live > limit or s.tokens != ids[:live]):
            live = 0  # (a budget of 0 turns reuse off, the live state's too: every prompt is computed whole)
        entry = self.cache.lookup(ids, limit) if self.cache.budget else None
        self.metrics.inc("strata_prefix_cache_lookups_total")
        if entry is not None and len(entry.tokens) > live:
            s.restore(entry.checkpoint)
            held = len(entry.tokens)
        elif live:
            held = live
        else:
            if s.position:
                s.reset()
            held = 0
        if held:
            self.metrics.inc("strata_prefix_cache_hits_total")
        return held

    def _prefill(self, req: Request, ids: list, held: int) -> bool:
        """Step 3: commit ids[held:-1], checkpointing at chosen boundaries and at the end. False: cancelled."""
        s, target, gap = self.session, len(ids) - 1, self.checkpoint_gap
        marks, last = [], held
        for b in sorted(set(req.boundaries)):
            if held < b < target and b - last >= gap:
                marks.append(b)
                last = b
        marks = marks[-MAX_BOUNDARY_CHECKPOINTS:]
        for stop in marks + [target]:
            while s.position < stop:
                if req.cancelled.is_set():
                    return False
                n = min(PROMPT_WINDOW, stop - s.position)
                prefill(s, ids[s.position:s.position + n], chunk=PROMPT_WINDOW)
            if stop > held and self.cache.budget and not self.cache.contains(ids[:stop]):
                self.cache.add(ids[:stop], s.checkpoint(), "boundary" if stop < target else "prompt")
        return True

    def _account(self, stats: LoopStats, computed: int, prefill_s: float, finish: str) -> None:
        m, t = self.metrics, self._totals
        m.inc("strata_prompt_tokens_total", stats.prompt_tokens)
        m.inc("strata_prompt_tokens_cached_total", stats.prompt_tokens - computed)
        m.inc("strata_generated_tokens_total", stats.generated)
        m.inc("strata_drafted_tokens_total", stats.drafted)
        m.inc("strata_accepted_tokens_total", stats.accepted)
        m.inc("strata_windows_total", stats.windows)
        m.inc("strata_prefill_seconds_total", prefill_s)
        m.inc("strata_decode_seconds_total", stats.decode_s)
        if finish == "cancelled":
            m.inc("strata_requests_cancelled_total")
        t["prefill_tokens"] += computed
        t["prefill_s"] += prefill_s
        t["generated"] += stats.generated
        t["decode_s"] += stats.decode_s
        t["drafted"] += stats.drafted
        t["accepted"] += stats.accepted
        if t["drafted"]:
            m.set("strata_draft_acceptance_ratio", t["accepted"] / t["drafted"])
        if t["decode_s"] > 0:
            m.set("strata_decode_tokens_per_second", t["generated"] / t["decode_s"])
        if t["prefill_s"] > 0:
            m.set("strata_prefill_tokens_per_second", t["prefill_tokens"] / t["prefill_s"])

    def _update_cache_gauges(self) -> None:
        m, c = self.metrics, self.cache
        m.set("strata_prefix_cache_entries", len(c))
        m.set("strata_prefix_cache_bytes", c.nbytes)
        ev = c.stats.evictions - m.get("strata_prefix_cache_evictions_total")
        if ev > 0:
            m.inc("strata_prefix_cache_evictions_total", ev)

