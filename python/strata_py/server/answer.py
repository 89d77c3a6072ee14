"""A request's events on the event loop, and what they add up to in OpenAI's shapes: text, usage (with
prompt_tokens_details.cached_tokens), logprobs (chat's and the legacy completions' layout), finish reason, and
the error a failed request answers with."""
from __future__ import annotations

import asyncio
import json

from .. import __version__
from .schema import ApiError, config_param
from .timeline import Closed, Done, Failed, Started, Token
from .token_text import TEXT_ONLY

FINGERPRINT = f"strata-{__version__}"


class Events:
    """Events from the worker thread, delivered on the event loop; batches() drains what has arrived."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._q: asyncio.Queue = asyncio.Queue()

    def emit(self, ev) -> None:  # worker thread
        self._loop.call_soon_threadsafe(self._q.put_nowait, ev)

    async def next_batch(self) -> list:
        """The events that have arrived (at least one)."""
        batch = [await self._q.get()]
        while not self._q.empty():
            batch.append(self._q.get_nowait())
        return batch

    async def batches(self, first: list | None = None):
        """Batches until the request's end (Done or Failed), starting with `first` when given."""
        batch = first
        while True:
            if batch is None:
                batch = await self.next_batch()
            yield batch
            if any(isinstance(e, (Done, Failed)) for e in batch):
                return
            batch = None


class Answer:
    """What a request's events add up to: text, token count, logprobs, finish, usage."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.text = []
        self.started: Started | None = None
        self.done: Done | None = None
        self.tokens: list[Token] = []

    def add(self, batch) -> tuple[str, list[Token]]:
        """Text and tokens of this batch; raises for a Failed event."""
        text, toks = [], []
        for e in batch:
            if isinstance(e, Started):
                self.started = e
            elif isinstance(e, Token):
                if e.id != TEXT_ONLY:
                    toks.append(e)
                text.append(e.text)
            elif isinstance(e, Done):
                self.done = e
            elif isinstance(e, Failed):
                raise failure(e.error)
        self.tokens += toks
        piece = "".join(text)
        self.text.append(piece)
        return piece, toks

    async def pieces(self, ev: "Events", first: list | None = None):
        """(text, tokens) of each batch as it arrives; (None, ApiError) once if the request failed."""
        async for batch in ev.batches(first):
            try:
                yield self.add(batch)
            except ApiError as e:
                yield None, e
                return

    def usage(self) -> dict:
        p = self.started.prompt_tokens if self.started else 0
        c = self.done.completion_tokens if self.done else 0
        cached = self.started.cached_tokens if self.started else 0
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def timings(self) -> dict:
        st = self.done.stats if self.done else {}
        s = self.started
        return {"cached_tokens": s.cached_tokens if s else 0, "queue_ms": round(s.queue_s * 1e3, 3) if s else 0.0,
                "prefill_ms": round(s.prefill_s * 1e3, 3) if s else 0.0,
                "decode_tok_s": round(st.get("decode_tok_s", 0.0), 2), "windows": st.get("windows", 0),
                "drafted": st.get("drafted", 0), "accepted": st.get("accepted", 0)}

    def finish_reason(self) -> str:
        return self.done.finish_reason if self.done else "stop"


def failure(err: BaseException) -> ApiError:
    if isinstance(err, ApiError):
        return err
    if isinstance(err, Closed):
        return ApiError(503, str(err), type="server_error", code="shutting_down")
    if isinstance(err, ValueError):
        return ApiError(400, str(err), config_param(str(err)))
    return ApiError(500, f"{type(err).__name__}: {err}", type="server_error")


def _token_info(tok, tid: int, lp: float) -> dict:
    b = tok.token_bytes(tid)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}


def chat_logprobs(tok, toks: list[Token]) -> dict:
    return {"content": [dict(_token_info(tok, t.id, t.logprob),
                             top_logprobs=[_token_info(tok, i, lp) for i, lp in (t.top or [])]) for t in toks]}


def completion_logprobs(tok, toks: list[Token], offset0: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    off = offset0
    for t in toks:
        s = tok.token_bytes(t.id).decode("utf-8", errors="replace")
        out["tokens"].append(s)
        out["token_logprobs"].append(t.logprob)
        out["top_logprobs"].append({tok.token_bytes(i).decode("utf-8", errors="replace"): lp for i, lp in (t.top or [])})
        out["text_offset"].append(off)
        off += len(t.text)
    return out


def dumps(d) -> str:
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))
