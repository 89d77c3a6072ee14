"""The fast attention paths (csrc/kernels/cpu/attend_avx512.cpp, attend_avx2.cpp) run groups of queries through
each block of cells together; their one-query twin (one_query=True: one query at a time, the kernel before
blocking) does the same operations in the same order. The two must give the same bits on fresh random inputs
for every shape the grouping can meet: T rows x nh heads per KV head (full groups, tails of 1..3 queries,
groups whose queries see different cell counts), cell counts around the 16- and 32-cell block edges, the head
sizes 64, 128 and 256, peaked and flat score distributions, and QSA's cell lists at T = 1."""
from __future__ import annotations

import numpy as np
import pytest

from seeds import fresh_rng
from strata_py import _core

ISAS = [i for i in ("avx2", "avx512") if (i == "avx2" and _core.best_isa() in ("avx2", "avx512")) or _core.best_isa() == i]


def _same(q, nh, k, v, n0, scale, isa, cells=()):
    fast = np.asarray(_core.attend(q, nh, k, v, n0, scale, isa, list(cells)))
    one = np.asarray(_core.attend(q, nh, k, v, n0, scale, isa, list(cells), one_query=True))
    return fast, one


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("isa", ISAS)
def test_blocked_equals_one_query(hd, isa):
    rng = fresh_rng()
    checked = 0
    for T in (1, 2, 3, 5, 8, 9, 33):
        for nh in (1, 2, 3, 4, 8):
            for n0 in (1, 15, 16, 17, 33, 100, 257):
                n = n0 + T - 1
                spread = float(rng.choice([1.0, 8.0]))  # 8: a few cells dominate, most exps tiny
                q = (rng.standard_normal((T * nh, hd)) * spread).astype(np.float32)
                q[rng.integers(T * nh)] = 0.0  # one query with all scores equal
                k = rng.standard_normal((n, hd), dtype=np.float32)
                v = rng.standard_normal((n, hd), dtype=np.float32)
                fast, one = _same(q, nh, k, v, n0, float(1 / np.sqrt(hd)), isa)
                assert np.isfinite(fast).all()
                assert np.array_equal(fast, one), (isa, hd, T, nh, n0, np.max(np.abs(fast - one)))
                checked += 1
    assert checked == 7 * 5 * 7


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("isa", ISAS)
def test_blocked_equals_one_query_long_window(hd, isa):
    # a prompt window as the model runs it: 64 rows x 2 heads over a long history (many full groups and blocks)
    rng = fresh_rng()
    T, nh, n0 = 64, 2, 1000
    q = rng.standard_normal((T * nh, hd), dtype=np.float32)
    k = rng.standard_normal((n0 + T - 1, hd), dtype=np.float32)
    v = rng.standard_normal((n0 + T - 1, hd), dtype=np.float32)
    fast, one = _same(q, nh, k, v, n0, float(1 / np.sqrt(hd)), isa)
    assert np.array_equal(fast, one), (isa, hd, np.max(np.abs(fast - one)))


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("isa", ISAS)
def test_blocked_equals_one_query_cell_list(hd, isa):
    # QSA's sparse rows (T = 1): a sorted cell list, nh heads sharing it
    rng = fresh_rng()
    for nh in (1, 2, 3, 4, 8):
        for n, m in ((40, 7), (300, 37), (1000, 260)):
            k = rng.standard_normal((n, hd), dtype=np.float32)
            v = rng.standard_normal((n, hd), dtype=np.float32)
            q = rng.standard_normal((nh, hd), dtype=np.float32)
            cells = np.sort(rng.choice(n, m, replace=False)).astype(np.int32)
            fast, one = _same(q, nh, k, v, m, 0.125, isa, cells.tolist())
            assert np.array_equal(fast, one), (isa, hd, nh, n, m)
