"""Anti-slop phrases -> the token patterns of the C++ phrase automaton (csrc/sampling/phrase_automaton.h).

A phrase stands for its variants: as written, lower case, Capitalised (first letter upper), UPPER, each with
and without a leading space; every variant is tokenized as the model's tokenizer does, and each distinct
token sequence becomes one pattern with the phrase's strength (the largest, if two phrases share one).
The automaton itself keeps words whole (a no-space variant matches only at a word start) and resets at
newlines; its penalty rule is in phrase_automaton.h.

The shipped default list is data/ban_phrases.txt (chat-model slop; `default_phrases()`); users extend it:
    cfg.ban_phrases = default_phrases() + [("as an AI language model", float("inf"))]
or on the command line: --ban-phrases default --ban-phrases mine.txt
"""
from __future__ import annotations

from importlib import resources
from typing import Sequence

import numpy as np

DEFAULT_STRENGTH = 4.0  # logits subtracted at completion when a phrase file gives no strength
_CACHE_ENTRIES = 4      # automata kept per model (keyed by the phrase list)

# csrc/sampling/phrase_automaton.h PhraseTokenFlag
ENDS_BOUNDARY, NEWLINE, EOG, STARTS_WORD = 1, 2, 4, 8


def _word_byte(b: int) -> bool:
    return (48 <= b <= 57) or (65 <= b <= 90) or (97 <= b <= 122) or b == 95 or b >= 0x80


def default_phrases() -> list[tuple[str, float]]:
    """The shipped default list (strata_py/data/ban_phrases.txt)."""
    from .options import read_phrase_file
    return read_phrase_file(resources.files("strata_py") / "data" / "ban_phrases.txt")


def variants(phrase: str) -> list[str]:
    """The strings a phrase stands for: as written, lower, Capitalised, UPPER; with and without a leading space."""
    p = phrase.strip()
    cases = [p, p.lower(), p[:1].upper() + p[1:], p.upper()]
    out: list[str] = []
    for c in cases:
        for v in (c, " " + c):
            if v not in out:
                out.append(v)
    return out


def token_flags(tokenizer, n_vocab: int) -> np.ndarray:
    """uint8 [n_vocab] PhraseTokenFlag bits from each token's bytes (cached on the tokenizer)."""
    cached = getattr(tokenizer, "_phrase_flags", None)
    if cached is not None and len(cached) == n_vocab:
        return cached
    flags = np.full(n_vocab, ENDS_BOUNDARY, dtype=np.uint8)
    for t in range(min(n_vocab, tokenizer.n_vocab)):
        b = tokenizer.token_bytes(t)
        f = 0
        if not b or not _word_byte(b[-1]):
            f |= ENDS_BOUNDARY
        if b and _word_byte(b[0]):
            f |= STARTS_WORD
        if b"\n" in b or b"\r" in b:
            f |= NEWLINE
        flags[t] = f
    for t in tokenizer.eog_ids:
        if t < n_vocab:
            flags[t] |= EOG
    tokenizer._phrase_flags = flags
    return flags


def patterns(tokenizer, phrases: Sequence[tuple[str, float]]) -> tuple[list[list[int]], list[float]]:
    """Distinct token sequences of every variant of every phrase, each with its (largest) strength."""
    best: dict[tuple[int, ...], float] = {}
    for phrase, strength in phrases:
        for v in variants(phrase):
            ids = tuple(tokenizer.encode(v))
            if ids:
                best[ids] = max(best.get(ids, 0.0), float(strength))
    return [list(k) for k in best], list(best.values())


def automaton(model, phrases: Sequence[tuple[str, float]]):
    """The model's _core.PhraseAutomaton for this phrase list (built once, then cached on the model)."""
    from .. import _core

    key = tuple((str(p), float(s)) for p, s in phrases)
    cache: dict = model.__dict__.setdefault("_phrase_automata", {})
    a = cache.get(key)
    if a is None:
        pats, strengths = patterns(model.tokenizer, key)
        a = _core.PhraseAutomaton(pats, strengths, token_flags(model.tokenizer, model.n_vocab))
        if len(cache) >= _CACHE_ENTRIES:
            cache.pop(next(iter(cache)))
        cache[key] = a
    return a
