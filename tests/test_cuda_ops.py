"""The CUDA backend's other operations (csrc/kernels/cuda/ops_cuda.h) on the device, against the CPU: DeltaNet rows
and attention equal the CPU's scalar twins bit for bit (dn_rows_ref / attend_ref: the same float32 operations in the
same order, exp_shift's polynomial ported), MoE routing equals the CPU backend's bit for bit, and sampling gives the
CPU's tokens (greedy, temperature, top-k, top-p, min-p, penalties, the position-keyed uniform). For each, a T-row call
equals T one-row calls bit for bit (the window property). Fresh random inputs every run; outputs start as NaN / -1 on
the device, so an unwritten element shows. Skipped where no CUDA device is usable (CI)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_util import bits, needs_cuda
from strata_py import _core
from test_sampling import CONFIGS, rand_logits

pytestmark = needs_cuda
P = _core.SamplingParams


# ---------------------------------------------------------------- DeltaNet rows
def _dn_inputs(rng, T, dk, dv):
    S = (rng.standard_normal((dk, dv)) * 0.3).astype(np.float32)
    k = rng.standard_normal((T, dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    q = (rng.standard_normal((T, dk)) / np.sqrt(dk)).astype(np.float32)
    v = rng.standard_normal((T, dv)).astype(np.float32)
    gates = np.stack([rng.uniform(0.6, 1.0, T), rng.uniform(0.0, 1.0, T)], 1).astype(np.float32)
    return S, k, v, q, gates


@pytest.mark.parametrize("dk,dv", [(128, 128), (64, 64), (48, 80), (128, 37)])
def test_dn_rows_equals_cpu(dk, dv):
    """dk = 128 / 64 keep S's column in registers, others run on memory; T crosses the 32 rows of one launch."""
    rng = np.random.default_rng()
    for T in (1, 2, 5, 16, 33, int(rng.integers(1, 70))):
        for n_src in {T, 0, 1, int(rng.integers(0, T + 1))}:
            for read in (True, False):
                args = _dn_inputs(rng, T, dk, dv)
                got = _core.backend_dn_rows("cuda", *args, n_src, read)
                want = _core.backend_dn_rows("cpu", *args, n_src, read)
                ref = _core.dn_rows(*args, n_src, read, ref=True)  # dn_rows_ref, row by row
                msg = f"dk={dk} dv={dv} T={T} n_src={n_src} read={read}"
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(bits(g), bits(w), err_msg=msg)
                np.testing.assert_array_equal(bits(got[0]), bits(ref[0]), err_msg=msg)
                if n_src < T:
                    np.testing.assert_array_equal(bits(got[1]), bits(ref[1]), err_msg=msg)
                if read:
                    np.testing.assert_array_equal(bits(got[2]), bits(ref[2]), err_msg=msg)
                else:
                    assert np.isnan(got[2]).all()  # o untouched without a read


@pytest.mark.parametrize("dk,dv", [(128, 128), (96, 64)])
def test_dn_rows_window_equals_one_row_calls(dk, dv):
    """A T-row call (in place, and a verify window on S_work) equals T one-row calls chained through S."""
    rng = np.random.default_rng()
    T = 40
    S, k, v, q, gates = _dn_inputs(rng, T, dk, dv)
    cur, outs = S, []
    for t in range(T):
        cur, _, o = _core.backend_dn_rows("cuda", cur, k[t:t + 1], v[t:t + 1], q[t:t + 1], gates[t:t + 1], 1)
        cur = np.asarray(cur, np.float32).reshape(dk, dv)
        outs.append(np.asarray(o, np.float32))
    s_in, _, o_in = _core.backend_dn_rows("cuda", S, k, v, q, gates, T)
    s_ver, s_work, o_ver = _core.backend_dn_rows("cuda", S, k, v, q, gates, 0)
    np.testing.assert_array_equal(bits(s_in), bits(cur.ravel()))
    np.testing.assert_array_equal(bits(o_in), bits(np.concatenate(outs)))
    np.testing.assert_array_equal(bits(s_ver), bits(S.ravel()))  # a verify window leaves S alone
    np.testing.assert_array_equal(bits(s_work), bits(cur.ravel()))
    np.testing.assert_array_equal(bits(o_ver), bits(np.concatenate(outs)))


# ---------------------------------------------------------------- attention
def _attn_inputs(rng, T, nh, hd, n0):
    n = n0 + T - 1 + int(rng.integers(0, 5))
    q = rng.standard_normal((T * nh, hd)).astype(np.float32)
    k = (rng.standard_normal((n, hd)) * rng.uniform(0.5, 3)).astype(np.float32)
    v = rng.standard_normal((n, hd)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("hd,nh", [(256, 8), (128, 4), (64, 1), (80, 3), (300, 2)])
def test_attend_equals_attend_ref(hd, nh):
    rng = np.random.default_rng()
    scale = float(1 / np.sqrt(hd))
    for T, n0 in ((1, 1), (1, 700), (4, 37), (16, 300), (int(rng.integers(1, 20)), int(rng.integers(1, 2000)))):
        q, k, v = _attn_inputs(rng, T, nh, hd, n0)
        got = _core.backend_attend("cuda", q, nh, k, v, n0, scale)
        want = _core.attend(q, nh, k, v, n0, scale, isa="scalar")
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"hd={hd} nh={nh} T={T} n0={n0}")


def test_attend_long_context_equals_attend_ref():
    rng = np.random.default_rng()
    q, k, v = _attn_inputs(rng, 2, 8, 256, 9000)
    got = _core.backend_attend("cuda", q, 8, k, v, 9000, 0.0625)
    np.testing.assert_array_equal(bits(got), bits(_core.attend(q, 8, k, v, 9000, 0.0625, isa="scalar")))


@pytest.mark.parametrize("hd", [256, 64])
def test_attend_cell_list_equals_attend_ref(hd):
    """QSA (T = 1): the attended cells are a sorted list of cells."""
    rng = np.random.default_rng()
    for n_cells in (1, 50, 1000):
        q, k, v = _attn_inputs(rng, 1, 8, hd, 3000)
        cells = np.sort(rng.choice(k.shape[0], n_cells, replace=False)).astype(np.int32).tolist()
        got = _core.backend_attend("cuda", q, 8, k, v, n_cells, 0.1, cells)
        want = _core.attend(q, 8, k, v, n_cells, 0.1, isa="scalar", cells=cells)
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{n_cells} cells")
    with pytest.raises(ValueError, match="cell list needs T = 1"):
        _core.backend_attend("cuda", np.ones((16, hd), np.float32), 8, k, v, 2, 0.1, [0, 1])


@pytest.mark.parametrize("hd", [256, 128, 64])
def test_attend_tiles_equal_attend_ref(hd):
    """The tiled kernels of prompt pieces (k_scores_tiles, k_softmax_v_tiles): attend_ref's bits from one query up
    (partial query and cell tiles, rows that see fewer cells than the tile stages, long contexts) and at the default
    threshold (1024 queries, as a 512-row piece of the 80B file), and the same bits as the kernels a block per
    (row, head)."""
    rng = np.random.default_rng()
    scale = float(1 / np.sqrt(hd))
    cases = [(1, 8, 1), (1, 3, 700), (3, 3, 37), (17, 8, 300), (40, 1, 1), (100, 5, 2000),
             (int(rng.integers(1, 60)), int(rng.integers(1, 9)), int(rng.integers(1, 3000)))]
    try:
        for min_queries in (1, 1024):
            _core.cuda_prefer_attn_tiles(True, min_queries)
            for T, nh, n0 in cases if min_queries == 1 else [(128, 8, 1), (1100, 1, 5), (205, 5, 700)]:
                q, k, v = _attn_inputs(rng, T, nh, hd, n0)
                got = _core.backend_attend("cuda", q, nh, k, v, n0, scale)
                want = _core.attend(q, nh, k, v, n0, scale, isa="scalar")
                np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"hd={hd} T={T} nh={nh} n0={n0}")
                if T * nh >= 1024:
                    _core.cuda_prefer_attn_tiles(False, min_queries)
                    np.testing.assert_array_equal(bits(_core.backend_attend("cuda", q, nh, k, v, n0, scale)), bits(got))
                    _core.cuda_prefer_attn_tiles(True, min_queries)
    finally:
        _core.cuda_prefer_attn_tiles(True, 1024)


def test_attend_window_equals_one_row_calls():
    rng = np.random.default_rng()
    T, nh, hd, n0 = 16, 8, 256, 500
    q, k, v = _attn_inputs(rng, T, nh, hd, n0)
    win = _core.backend_attend("cuda", q, nh, k, v, n0, 0.0625)
    one = [_core.backend_attend("cuda", q[t * nh:(t + 1) * nh], nh, k, v, n0 + t, 0.0625) for t in range(T)]
    np.testing.assert_array_equal(bits(win), bits(np.concatenate(one)))


# ---------------------------------------------------------------- MoE routing
@pytest.mark.parametrize("E,k", [(512, 10), (64, 8), (128, 1), (7, 7), (1000, 12), (2048, 8)])
def test_moe_route_equals_cpu(E, k):
    rng = np.random.default_rng()
    for ties in (False, True):
        T = int(rng.integers(1, 20))
        logits = (rng.standard_normal((T, E)) * rng.uniform(0.5, 4)).astype(np.float32)
        if ties:
            logits = np.round(logits * 2) / 2  # equal probabilities: the lower id first
        sel, wt = _core.backend_moe_route("cuda", logits, k)
        sel_c, wt_c = _core.backend_moe_route("cpu", logits, k)
        np.testing.assert_array_equal(np.asarray(sel), np.asarray(sel_c), err_msg=f"E={E} k={k} ties={ties}")
        np.testing.assert_array_equal(bits(wt), bits(wt_c), err_msg=f"E={E} k={k} ties={ties}")


def test_moe_route_window_equals_one_row_calls():
    rng = np.random.default_rng()
    logits = rng.standard_normal((16, 512)).astype(np.float32)
    sel, wt = _core.backend_moe_route("cuda", logits, 10)
    for t in range(16):
        s1, w1 = _core.backend_moe_route("cuda", logits[t:t + 1], 10)
        assert list(s1) == list(sel[t * 10:(t + 1) * 10])
        np.testing.assert_array_equal(bits(w1), bits(wt[t * 10:(t + 1) * 10]))


# ---------------------------------------------------------------- sampling
PENALTIES = [dict(), dict(repetition_penalty=1.3),
             dict(presence_penalty=0.5, frequency_penalty=0.25, penalty_last_n=37),
             dict(repetition_penalty=0.8, presence_penalty=-0.4, frequency_penalty=0.1, penalty_last_n=1000)]


@pytest.mark.parametrize("pen", PENALTIES, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS + [dict(temperature=0.0)], ids=str)
def test_sample_rows_equals_cpu(cfg, pen):
    rng = np.random.default_rng()
    V = int(rng.choice([1000, 5003]))
    for ties in (False, True):
        T = int(rng.integers(1, 17))
        logits = np.stack([rand_logits(rng, V, scale=rng.uniform(0.5, 6), ties=ties) for _ in range(T)])
        committed = rng.integers(0, V, int(rng.integers(0, 80))).astype(np.int32)
        inputs = rng.integers(0, V, T).astype(np.int32)
        inputs[rng.random(T) < 0.3] = committed[0] if len(committed) else 0  # repeats: counts > 1
        p = P(seed=int(rng.integers(0, 1 << 62)), **cfg, **pen)
        pos0 = int(rng.integers(0, 1 << 20))
        got = _core.backend_sample_rows("cuda", logits, p, committed, inputs, pos0)
        want = _core.sample_rows(logits, p, committed, inputs, pos0)
        assert list(got) == list(want), (cfg, pen, ties)


@pytest.mark.parametrize("cfg", [dict(temperature=0.8, top_p=0.95), dict(temperature=1.0, top_k=50),
                                 dict(temperature=0.7, min_p=0.05), dict(temperature=1.0), dict(temperature=0.0),
                                 dict(temperature=1.2, top_k=3000, top_p=0.99)], ids=str)
def test_sample_rows_full_vocab_equals_cpu(cfg):
    """V = 151936 (Qwen3-Next) with a realistic head, and the full-vocabulary candidate sets of a flat row."""
    rng = np.random.default_rng()
    V, T = 151936, 6
    logits = np.stack([rand_logits(rng, V, scale=2.5) for _ in range(T)])
    logits[:4, rng.integers(0, V, 50)] += 12
    p = P(seed=int(rng.integers(0, 1 << 62)), repetition_penalty=1.1, **cfg)
    inputs = rng.integers(0, V, T).astype(np.int32)
    committed = rng.integers(0, V, 100).astype(np.int32)
    got = _core.backend_sample_rows("cuda", logits, p, committed, inputs, 77)
    assert list(got) == list(_core.sample_rows(logits, p, committed, inputs, 77))


def test_sample_rows_nonfinite():
    rng = np.random.default_rng()
    V = 300
    for cfg in CONFIGS + [dict()]:
        p = P(seed=5, **cfg)
        logits = np.stack([rand_logits(rng, V) for _ in range(8)])
        logits[:, rng.integers(0, V, 40)] = np.nan
        logits[:, rng.integers(0, V, 40)] = -np.inf
        logits[3, rng.integers(0, V, 2)] = np.inf
        args = (p, np.zeros(0, np.int32), np.arange(8, dtype=np.int32), 10)
        assert list(_core.backend_sample_rows("cuda", logits, *args)) == list(_core.sample_rows(logits, *args))
    logits[5] = np.nan
    with pytest.raises(RuntimeError, match="no finite logit at position 16"):
        _core.backend_sample_rows("cuda", logits, *args)
    with pytest.raises(ValueError, match="SamplingParams.top_p"):
        bad = P()
        bad.top_p = 1.5
        _core.backend_sample_rows("cuda", logits, bad, *args[1:])


@pytest.mark.parametrize("cfg", [dict(temperature=0.9, top_p=0.9, repetition_penalty=1.2), dict(temperature=0.0,
                                 presence_penalty=0.7)], ids=str)
def test_sample_rows_window_equals_one_row_calls(cfg):
    """Row i of a window = a one-row call at pos0 + i with inputs[0..i-1] committed (position keying)."""
    rng = np.random.default_rng()
    V, T = 4000, 16
    logits = np.stack([rand_logits(rng, V, scale=3) for _ in range(T)])
    committed = rng.integers(0, V, 30).astype(np.int32)
    inputs = rng.integers(0, 50, T).astype(np.int32)
    p = P(seed=99, **cfg)
    win = _core.backend_sample_rows("cuda", logits, p, committed, inputs, 500)
    for i in range(T):
        one = _core.backend_sample_rows("cuda", logits[i:i + 1], p, np.concatenate([committed, inputs[:i]]),
                                        inputs[i:i + 1], 500 + i)
        assert one[0] == win[i], i


# ---------------------------------------------------------------- the MTP drafts' argmax and embedding gather
def test_argmax_rows_equals_cpu():
    """Ties to the lowest id, NaN skipped, `none` for rows of NaN / -inf only, +0 == -0; a T-row call equals the
    rows one by one (a block per row)."""
    from test_backend import argmax_rows_rows
    rng = np.random.default_rng()
    for V in (1, 7, 512, 513, 8192, 151936):
        x = argmax_rows_rows(rng, V)
        for none in (0, -1):
            want = list(_core.backend_argmax_rows("cpu", x, none))
            assert list(_core.backend_argmax_rows("cuda", x, none)) == want, V
            assert [_core.backend_argmax_rows("cuda", x[t:t + 1], none)[0] for t in range(len(x))] == want


@pytest.mark.parametrize("typ", ["F32", "F16", "BF16", "Q8_0"])
def test_embed_rows_equals_cpu(typ):
    from cuda_util import weights
    rng = np.random.default_rng()
    rows, cols = 300, 2048
    raw = weights(rng, typ, rows, cols)
    ids = rng.integers(0, rows, 17).astype(np.int32)
    got = _core.backend_embed_rows("cuda", typ, raw, cols, ids)
    assert (bits(got) == bits(_core.backend_embed_rows("cpu", typ, raw, cols, ids))).all()
