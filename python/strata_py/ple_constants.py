"""The PLE n-gram hash constants of Qwen4-Exp, derived from the config exactly as transformers derives them
(`modeling_qwen4_exp.py`: `_build_layer_multipliers`, `_find_nth_prime_after`; spec qwen4exp.md §1.7).

A checkpoint stores them as int64 buffers and a GGUF as u64 arrays (`ple.layer_multipliers`, `ple.head_offsets`,
`ple.head_vocab_sizes`), so an engine reads them rather than re-deriving them; this module makes them for
synthetic files (synth_next.py) and checks a checkpoint's buffers against its config (convert_qwen4exp.py).
"""
from __future__ import annotations

import math

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_PRIME_1 = 10007


def splitmix64(x: int) -> int:
    x = (x + _GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return (x ^ (x >> 31)) & _MASK64


def layer_multipliers(vocab_size: int, ngram_size: int, ple_layer_index: int, seed: int) -> list[int]:
    """m_0..m_{N-1}: odd, <= (2^63 - 1) // vocab_size, so id * m never overflows a signed 64-bit integer."""
    half = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _PRIME_1 * ple_layer_index
    return [2 * (splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % half) + 1 for i in range(ngram_size)]


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def head_vocab_sizes(base: int, n_heads: int, ple_layer_index: int) -> list[int]:
    """V_h: the (k*n_heads + h + 1)-th prime >= base, for the heads of the PLE layer with index k."""
    first = ple_layer_index * n_heads
    out, p, count = [], base - 1, 0
    while len(out) < n_heads:
        p += 1
        while not _is_prime(p):
            p += 1
        if count >= first:
            out.append(p)
        count += 1
    return out


def head_offsets(vocab_sizes: list[int]) -> list[int]:
    """O_h = sum of the sizes before head h."""
    out, total = [], 0
    for v in vocab_sizes:
        out.append(total)
        total += v
    return out


def table_rows(vocab_sizes: list[int], divisor: int) -> int:
    """Rows of the n-gram table: the sum of the head sizes padded up to a multiple of `divisor`."""
    return -(-sum(vocab_sizes) // divisor) * divisor
