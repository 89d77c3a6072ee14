"""DRY sequence breakers -> the token form of the C++ DRY penalty (csrc/sampling/dry.h).

A breaker is a string (llama.cpp's defaults: newline, colon, double quote, asterisk, config.LLAMACPP_DRY_BREAKERS;
strata's default is the double quote alone). As llama.cpp does
(get_overlapping_token_sequences, ported from koboldcpp): every token whose bytes contain the breaker is a
single-token breaker; a token whose bytes end with a prefix of the breaker is a head, with the tokenization of
the breaker's remaining characters as its tail (at most 20 tokens). Breakers longer than 40 bytes are cut.
Built once per tokenizer and breaker list.
"""
from __future__ import annotations

from functools import lru_cache

MAX_BREAKER_BYTES = 40
MAX_TAIL_TOKENS = 20


def breaker_sequences(tokenizer, n_vocab: int, breakers) -> tuple[list[int], list[list[int]]]:
    """(heads, tails) for `breakers`, deduplicated per head as llama.cpp keeps them."""
    seqs: dict[int, list[list[int]]] = {}
    toks = [tokenizer.token_bytes(t) for t in range(min(n_vocab, tokenizer.n_vocab))]
    for s in breakers:
        if not s:
            raise ValueError("bad option dry_sequence_breakers: an empty breaker (give at least one character)")
        b = s.encode("utf-8")[:MAX_BREAKER_BYTES]
        for t, word in enumerate(toks):
            lst = seqs.setdefault(t, [])
            if b in word:
                if [] not in lst:
                    lst.append([])
                continue
            pos = word.find(b[:1])
            while pos >= 0:
                i = 1
                match = True
                while i < len(b) and pos + i < len(word):
                    if word[pos + i] != b[i]:
                        match = False
                        break
                    i += 1
                if match:
                    tail = tokenizer.encode(b[i:].decode("utf-8", errors="ignore"))[:MAX_TAIL_TOKENS]
                    if tail not in lst:
                        lst.append(tail)
                pos = word.find(b[:1], pos + 1)
    heads, tails = [], []
    for t in sorted(seqs):
        for tail in seqs[t]:
            heads.append(t)
            tails.append(tail)
    return heads, tails


@lru_cache(maxsize=8)
def _cached(tokenizer, n_vocab: int, breakers: tuple, multiplier: float, base: float, allowed: int, last_n: int):
    from .. import _core
    heads, tails = breaker_sequences(tokenizer, n_vocab, breakers)
    return _core.DryPenalty(multiplier, base, allowed, last_n, heads, tails, n_vocab)


def dry_penalty(model, cfg):
    """The C++ DryPenalty for cfg's dry_* options, or None when DRY is off (dry_multiplier 0)."""
    if cfg.dry_multiplier == 0.0 or cfg.dry_penalty_last_n == 0:
        return None
    return _cached(model.tokenizer, model.n_vocab, tuple(cfg.dry_sequence_breakers), float(cfg.dry_multiplier),
                   float(cfg.dry_base), int(cfg.dry_allowed_length), int(cfg.dry_penalty_last_n))
