"""An answer's text aligned with its tokens, for streaming: each Token event carries the text it releases.

steering.TextStream turns tokens into text and holds back bytes that may still become a stop string (or an
incomplete UTF-8 character). Here the tokens are held with their bytes: a token's event goes out when the text
it helped form goes out, the text attached to the last of them. When a stop string completes, the tokens whose
bytes start before it are released (the text before the stop string, attached to the last one) and the tokens of
the stop string itself are dropped, so that logprobs list exactly the tokens of the visible text. At the end, an
incomplete UTF-8 character still held by the decoder becomes U+FFFD (as `Tokenizer.decode` renders it); when its
token already went out with an earlier piece of text, that tail goes out as a text-only event (id TEXT_ONLY), so the
answer's text always equals the decoded tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..steering import TextStream


TEXT_ONLY = -1  # Token.id of an event that carries text but no token (the end of an answer's text)


@dataclass
class Token:
    id: int
    text: str              # the text this token releases ("" when a later token of the same text carries it)
    logprob: float | None = None
    top: list | None = None  # [(id, logprob)] most likely first, when top logprobs were asked for


class TokenText:
    def __init__(self, tokenizer, stops=()):
        self._tok = tokenizer
        self._stream = TextStream(tokenizer, stops, skip_special=True)
        self._held: list[tuple[Token, int]] = []  # (event, offset of its first byte in the token bytes)
        self._bytes = 0     # token bytes so far (control tokens count none: their text is not shown)
        self._shown = 0     # bytes of text released so far

    @property
    def stopped(self) -> bool:
        return self._stream.stopped

    def push(self, tid: int, logprob: float | None = None, top: list | None = None) -> list[Token]:
        """Feed one token; the events released now (possibly none)."""
        if self._stream.stopped:
            return []
        ev = Token(int(tid), "", logprob, top)
        self._held.append((ev, self._bytes))
        if not self._tok.is_control(tid):
            self._bytes += len(self._tok.token_bytes(tid))
        piece = self._stream.push(tid)
        if self._stream.stopped:  # keep the tokens whose bytes start before the stop string
            end = self._shown + len(piece.encode("utf-8"))
            held = [e for e, off in self._held if off < end]
            self._held = []
            return self._release(held, piece)
        if not piece:
            return []
        held, self._held = [e for e, _ in self._held], []
        return self._release(held, piece)

    def flush(self) -> list[Token]:
        """End of the answer: the held tokens, with the held text (a stop string's prefix is ordinary text)."""
        tail = self._stream.flush()
        held, self._held = [e for e, _ in self._held], []
        if not held and tail:
            held = [Token(TEXT_ONLY, "")]
        return self._release(held, tail)

    def _release(self, held: list[Token], piece: str) -> list[Token]:
        if held:
            held[-1].text = piece
        self._shown += len(piece.encode("utf-8"))
        return held
