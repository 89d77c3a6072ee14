"""The backend boundary (csrc/backend/backend.h) on the CPU: Backend::matmul and ::rmsnorm of the CPU backend are
today's kernels (bit-identical to _core.matmul on the active path and to its scalar twin), and a build or machine
without a usable GPU says so: cuda_available() is False and asking for the CUDA backend raises a RuntimeError that
says why (the CMake option, or the missing device)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_util import CUDA_TYPES, NOT_ON_CUDA, bits, weights
from strata_py import _core


@pytest.mark.parametrize("typ", CUDA_TYPES + NOT_ON_CUDA)
def test_cpu_backend_is_todays_kernels(typ):
    rng = np.random.default_rng()
    rows, cols = int(rng.integers(1, 40)), 512
    w = weights(rng, typ, rows, cols)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    got = _core.backend_matmul("cpu", w, typ, rows, cols, x)
    np.testing.assert_array_equal(bits(got), bits(_core.matmul(w, typ, rows, cols, x)))
    np.testing.assert_array_equal(bits(got), bits(_core.matmul(w, typ, rows, cols, x, isa="scalar")))


def test_cpu_backend_rmsnorm():
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 300)).astype(np.float32) * 3
    w = rng.standard_normal(300).astype(np.float32)
    got = _core.backend_rmsnorm("cpu", x, w, 1e-6)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_bad_input_names_the_culprit():
    x = np.ones((1, 512), np.float32)
    with pytest.raises(ValueError, match="has 10 bytes.*needs"):
        _core.backend_matmul("cpu", np.zeros(10, np.uint8), "Q4_K", 4, 512, x)
    with pytest.raises(ValueError, match="unknown ggml type 'Q9_K'"):
        _core.backend_matmul("cpu", np.zeros(10, np.uint8), "Q9_K", 4, 512, x)
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        _core.backend_name("tpu")
    with pytest.raises(ValueError, match="multiple of 256"):
        _core.backend_matmul("cpu", np.zeros(144, np.uint8), "Q4_K", 1, 300, np.ones((1, 300), np.float32))


@pytest.mark.skipif(_core.cuda_available(), reason="a CUDA device is usable here")
def test_no_gpu_says_why():
    assert isinstance(_core.cuda_info(), str) and _core.cuda_info()
    with pytest.raises(RuntimeError, match="STRATA_CUDA=ON|no usable CUDA device"):
        _core.backend_name("cuda")
    with pytest.raises(RuntimeError, match="STRATA_CUDA=ON|no usable CUDA device"):
        _core.cuda_bench_launch()


def test_cpu_backend_dn_rows_is_todays_kernel():
    rng = np.random.default_rng()
    dk, dv, T = 128, 128, 5
    S = rng.standard_normal((dk, dv)).astype(np.float32)
    k, q = rng.standard_normal((T, dk)).astype(np.float32), rng.standard_normal((T, dk)).astype(np.float32)
    v = rng.standard_normal((T, dv)).astype(np.float32)
    gates = rng.uniform(0.5, 1.0, (T, 2)).astype(np.float32)
    for n_src in (T, 0, 2):
        got = _core.backend_dn_rows("cpu", S, k, v, q, gates, n_src)
        want = _core.dn_rows(S, k, v, q, gates, n_src, True, ref=True)
        np.testing.assert_array_equal(bits(got[0]), bits(want[0]))
        np.testing.assert_array_equal(bits(got[2]), bits(want[2]))
        if n_src < T:
            np.testing.assert_array_equal(bits(got[1]), bits(want[1]))
        else:
            assert np.isnan(got[1]).all()  # S_work untouched by an in-place call


def test_cpu_backend_attend_is_todays_kernel():
    rng = np.random.default_rng()
    q = rng.standard_normal((3 * 4, 128)).astype(np.float32)
    k, v = rng.standard_normal((90, 128)).astype(np.float32), rng.standard_normal((90, 128)).astype(np.float32)
    np.testing.assert_array_equal(bits(_core.backend_attend("cpu", q, 4, k, v, 80, 0.1)),
                                  bits(_core.attend(q, 4, k, v, 80, 0.1)))
    cells = [1, 5, 6, 50]
    np.testing.assert_array_equal(bits(_core.backend_attend("cpu", q[:4], 4, k, v, 4, 0.1, cells)),
                                  bits(_core.attend(q[:4], 4, k, v, 4, 0.1, cells=cells)))


def test_cpu_backend_moe_route():
    """softmax in fp32, top-k by probability with ties to the lower id, weights renormalised over the k."""
    rng = np.random.default_rng()
    logits = np.round(rng.standard_normal((6, 64)) * 2).astype(np.float32) / 2  # many ties
    sel, wt = _core.backend_moe_route("cpu", logits, 8)
    sel, wt = np.asarray(sel).reshape(6, 8), np.asarray(wt).reshape(6, 8)
    for t in range(6):
        l64 = logits[t].astype(np.float64)
        p = np.exp(l64 - l64.max())
        p /= p.sum()
        order = sorted(range(64), key=lambda e: (-logits[t][e], e))[:8]  # p is monotone in the logit
        assert list(sel[t]) == order
        np.testing.assert_allclose(wt[t], p[order] / p[order].sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="k = 65 for 64 experts"):
        _core.backend_moe_route("cpu", logits, 65)


def test_cpu_backend_sample_rows_is_todays_sampler():
    rng = np.random.default_rng()
    logits = rng.standard_normal((4, 500)).astype(np.float32) * 3
    committed, inputs = rng.integers(0, 500, 20).astype(np.int32), rng.integers(0, 500, 4).astype(np.int32)
    for kw in (dict(), dict(temperature=0.8, top_p=0.9, repetition_penalty=1.2, seed=3)):
        p = _core.SamplingParams(**kw)
        assert list(_core.backend_sample_rows("cpu", logits, p, committed, inputs, 9)) == \
            list(_core.sample_rows(logits, p, committed, inputs, 9))


def argmax_rows_rows(rng, V):
    """Rows that exercise argmax's rules: exact ties, NaN among the logits, -inf, every logit NaN, every -inf,
    NaN and -inf only, +0 against -0 (equal: the lower id wins), one finite logit among NaN."""
    rows = [rng.standard_normal(V).astype(np.float32) for _ in range(3)]
    t = np.round(rng.standard_normal(V) * 2).astype(np.float32)
    t[rng.integers(0, V, 5)] = t.max()
    rows.append(t)
    n = rng.standard_normal(V).astype(np.float32)
    n[rng.integers(0, V, V // 3)] = np.nan
    n[rng.integers(0, V, 3)] = -np.inf
    rows.append(n)
    rows.append(np.full(V, np.nan, np.float32))
    rows.append(np.full(V, -np.inf, np.float32))
    m = np.full(V, np.nan, np.float32)
    m[::2] = -np.inf
    rows.append(m)
    z = np.full(V, -1.0, np.float32)
    z[V // 2], z[V // 3], z[V - 1] = 0.0, -0.0, 0.0
    rows.append(z)
    o = np.full(V, np.nan, np.float32)
    o[int(rng.integers(0, V))] = -5.0
    rows.append(o)
    return np.stack(rows)


def argmax_expected(row, none):
    ok = ~np.isnan(row)
    if not ok.any() or row[ok].max() == -np.inf:
        return none
    return int(np.flatnonzero(ok & (row == row[ok].max()))[0])


def test_cpu_backend_argmax_rows():
    """sampler.h argmax per row (the largest non-NaN logit, its lowest id), `none` where every logit is NaN / -inf."""
    rng = np.random.default_rng()
    for V in (1, 7, 16, 100, 8192):
        x = argmax_rows_rows(rng, V)
        for none in (0, -1):
            assert list(_core.backend_argmax_rows("cpu", x, none)) == [argmax_expected(r, none) for r in x]


def test_cpu_backend_embed_rows_is_the_dequantizer():
    """Backend::embed_rows: the gathered rows, each types.h's dequantizer output bit for bit."""
    rng = np.random.default_rng()
    rows, cols = 40, 256
    for typ in ("F32", "F16", "BF16", "Q8_0", "Q4_K"):
        raw = weights(rng, typ, rows, cols)
        ids = rng.integers(0, rows, 9).astype(np.int32)
        got = np.asarray(_core.backend_embed_rows("cpu", typ, raw, cols, ids)).reshape(9, cols)
        table = np.asarray(_core.dequantize(raw, typ, rows * cols)).reshape(rows, cols)
        assert (bits(got) == bits(table[ids])).all(), typ
    with pytest.raises(ValueError, match="id 40 outside"):
        _core.backend_embed_rows("cpu", "Q8_0", weights(rng, "Q8_0", rows, cols), cols, np.array([40], np.int32))
