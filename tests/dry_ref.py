"""A brute-force reference of the DRY penalty (csrc/sampling/dry.h), written from its definition rather than
from llama.cpp's Z-algorithm: for every earlier position, compare the sequence ending there with the window's
suffix token by token. O(N^2); used by tests/test_dry.py on random token streams."""
from __future__ import annotations

import math

import numpy as np


def _rep_limit(w, breakers):
    """Tokens after the most recent breaker (the window's length if none); breakers: (head, tail) pairs."""
    N = len(w)
    for i in range(N):                           # i tokens back from the newest
        tok = w[N - 1 - i]
        best = -1
        for head, tail in breakers:
            if head != tok or len(tail) > i or len(tail) <= best:
                continue
            if all(tail[o] == w[N - 1 - (i - o - 1)] for o in range(len(tail))):
                best = len(tail)
        if best >= 0:
            return i - best
    return N


def dry_ref(history, multiplier, base, allowed, last_n, breakers):
    """{token: amount subtracted} for a row whose history is `history` (a list of ints)."""
    if multiplier == 0.0 or base < 1.0 or last_n == 0:
        return {}
    N = len(history) if last_n < 0 else min(len(history), last_n)
    w = list(history[len(history) - N:])
    if N <= allowed:
        return {}
    limit = _rep_limit(w, breakers)
    if limit < allowed:
        return {}
    longest = {}
    for j in range(N - 1):                       # the sequence ending at j vs the window's suffix
        n = 0
        while n <= j and w[j - n] == w[N - 1 - n]:
            n += 1
        n = min(n, limit)
        if n >= allowed:
            t = w[j + 1]
            longest[t] = max(longest.get(t, 0), n)
    singles = {h for h, tail in breakers if not tail}
    b32 = float(np.float32(base))
    max_exp = int(np.float32(88.7228391) / np.float32(math.log(b32))) if b32 > float(np.float32(1.000001)) else 0
    out = {}
    for t, n in longest.items():
        if t in singles:
            continue
        e = n - allowed
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[t] = float(np.float32(float(np.float32(multiplier)) * b32 ** e))
    return out
