"""server/token_text.py: an answer's text, assembled from the events TokenText releases, equals the decoded
tokens (U+FFFD for an incomplete UTF-8 tail, as Tokenizer.decode renders it), with and without stop strings;
every token is released exactly once, in order."""
from __future__ import annotations

import numpy as np

from strata_py.server.token_text import TEXT_ONLY, TokenText


class ByteVocab:
    """A vocabulary given as the bytes of each token (TokenText needs token_bytes and is_control)."""

    def __init__(self, toks):
        self.toks = toks

    def token_bytes(self, i):
        return self.toks[i]

    def is_control(self, i):
        return False


def _answer(vocab, ids, stops=()):
    tt = TokenText(vocab, stops)
    evs = [e for t in ids for e in tt.push(t)] + tt.flush()
    return "".join(e.text for e in evs), [e.id for e in evs if e.id != TEXT_ONLY]


def test_incomplete_tail_after_released_text():
    # token 1 completes "V" and starts a 3-byte character that never completes: "V" goes out with token 1,
    # the U+FFFD of the tail must still reach the answer (it was lost when no token was held at the end)
    v = ByteVocab([b"ab", b"V\xe2", b"\x82", b"\xac!"])
    for ids in ([0, 1], [0, 1, 2], [1], [0, 1, 2, 3], [1, 3]):
        text, toks = _answer(v, ids)
        assert text == b"".join(v.toks[i] for i in ids).decode("utf-8", errors="replace"), ids
        assert toks == ids


def test_random_byte_tokens_with_stops():
    rng = np.random.default_rng(3)
    pool = [b"\xe2", b"\x82", b"\xac", b"a", b"b", b"\xf0\x9f", b"\x98\x80", b"</", b"s>", b"V\xe2", b"\xc3"]
    v = ByteVocab(pool)
    for _ in range(300):
        ids = [int(i) for i in rng.integers(0, len(pool), int(rng.integers(1, 12)))]
        whole = b"".join(pool[i] for i in ids)
        text, toks = _answer(v, ids)
        assert text == whole.decode("utf-8", errors="replace")
        assert toks == ids
        text, _ = _answer(v, ids, stops=["</s>"])
        cut = whole.split(b"</s>")[0]
        assert text == cut.decode("utf-8", errors="replace"), (ids, text)
