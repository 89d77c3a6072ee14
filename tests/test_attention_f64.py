"""Attention over the cache (csrc/kernels/attend.h) against a float64 numpy softmax attention at the head sizes
of real checkpoints (64, 128, 256), on every kernel path this CPU has: several query heads per KV head, windows
of 1..8 rows (row t sees cells 0..n0+t-1), short and long contexts, peaked and flat score distributions.
The bound is float32's: the kernels accumulate in float32 (and use a vectorised exp), so per output value
|o - o64| <= 1e-5 * max|v| (the largest error seen when this was written was below 1e-6)."""
from __future__ import annotations

import numpy as np
import pytest

from seeds import fresh_rng
from strata_py import _core

ISAS = ["scalar"] + (["avx512"] if _core.best_isa() == "avx512" else [])


def attention_f64(q, nh, k, v, n0, scale):
    """q[T*nh][hd] (row-major by row then head), k/v[n][hd]: row t attends to cells 0..n0+t-1, in float64."""
    T = q.shape[0] // nh
    qd, kd, vd = (a.astype(np.float64) for a in (q, k, v))
    out = np.empty_like(qd)
    for t in range(T):
        n = n0 + t
        s = qd[t * nh:(t + 1) * nh] @ kd[:n].T * scale          # [nh, n]
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[t * nh:(t + 1) * nh] = (p / p.sum(axis=1, keepdims=True)) @ vd[:n]  # [nh, hd]
    return out


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("isa", ISAS)
def test_attention_matches_float64(hd, isa):
    rng = fresh_rng()
    worst = 0.0
    for n0, T, nh, spread in ((1, 1, 1, 1.0), (5, 8, 4, 1.0), (37, 3, 2, 8.0), (300, 8, 2, 1.0), (1500, 2, 4, 4.0)):
        n = n0 + T - 1
        k = rng.standard_normal((n, hd), dtype=np.float32)
        v = rng.standard_normal((n, hd), dtype=np.float32)
        q = (rng.standard_normal((T * nh, hd)) * spread).astype(np.float32)  # spread 8: a few cells dominate
        scale = float(1 / np.sqrt(hd))
        got = np.asarray(_core.attend(q, nh, k, v, n0, scale, isa)).reshape(T * nh, hd)
        want = attention_f64(q, nh, k, v, n0, scale)
        err = np.max(np.abs(got - want)) / np.max(np.abs(v))
        worst = max(worst, err)
        assert err <= 1e-5, (isa, hd, n0, T, nh, spread, err)
    assert worst > 0  # float32 arithmetic, compared with float64: a zero error would mean the same code ran
