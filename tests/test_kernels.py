"""Row-product kernels: every fast path bit-identical to its scalar `_ref` twin on fresh random inputs,
T-row results identical to 1-row results, dequantization bit-exact against gguf.quants, and dot products
within the float32 bound of a float64 reference (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: within the bound of their
int8 activations per 32 values, act32.h)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from kquant import ACT32_TYPES, q8_reference
from seeds import fresh_rng
from strata_py import _core, synth
from window_util import assert_windows_equal_serial

TYPES = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16, "Q8_0": QT.Q8_0, "Q4_0": QT.Q4_0, "Q4_1": QT.Q4_1,
         "Q5_0": QT.Q5_0, "Q5_1": QT.Q5_1, "IQ4_NL": QT.IQ4_NL, "MXFP4": QT.MXFP4}
BLOCK32 = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4"}  # 32-value blocks with float scales
ISAS = [i for i in ("avx2", "avx512") if (i == "avx2" and _core.best_isa() in ("avx2", "avx512")) or _core.best_isa() == i]
PATHS = ["scalar", *ISAS]  # every kernel path this CPU runs


def _weights(rng, typ, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.1, 3.0)
    if typ == "IQ4_NL":  # gguf.quants has no IQ4_NL quantizer: synth's random blocks (values of about 1)
        return synth.random_blocks32(rng, QT.IQ4_NL, rows * cols // 32, scale=1.0).ravel()
    q = gguf.quants.quantize(w, TYPES[typ]) if typ != "F32" else w
    return np.ascontiguousarray(q).view(np.uint8).ravel()


@pytest.mark.parametrize("typ", list(TYPES))
def test_dequantize_matches_gguf(typ):
    rng = fresh_rng()
    for _ in range(3):
        raw = _weights(rng, typ, 4, 256)
        ref = gguf.quants.dequantize(raw.reshape(4, -1), TYPES[typ]).ravel()
        np.testing.assert_array_equal(_core.dequantize(raw, typ, 1024), ref)


@pytest.mark.parametrize("typ", list(TYPES))
@pytest.mark.parametrize("isa", ISAS)
def test_fast_paths_equal_ref(typ, isa):
    rng = fresh_rng()  # fresh inputs every run
    for cols in ((64, 96, 256, 1024) if typ in BLOCK32 else (16, 40, 100, 256, 1000)):
        rows = int(rng.integers(1, 70))
        raw = _weights(rng, typ, rows, cols)
        for T in (1, 2, 3, 5, 8, 11, 19):  # 11, 19: several passes, a partial last one
            x = rng.standard_normal((T, cols)).astype(np.float32)
            ref = _core.matmul(raw, typ, rows, cols, x, isa="scalar")
            fast = _core.matmul(raw, typ, rows, cols, x, isa=isa, threads=2)
            np.testing.assert_array_equal(fast, ref, err_msg=f"{typ} {isa} cols={cols} T={T}")


@pytest.mark.parametrize("typ", list(TYPES))
def test_rows_independent_of_T(typ):
    rng = fresh_rng()
    rows, cols = 37, 256
    raw = _weights(rng, typ, rows, cols)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    for isa in PATHS:
        full = _core.matmul(raw, typ, rows, cols, x, isa=isa, threads=2)
        for t in range(8):
            one = _core.matmul(raw, typ, rows, cols, x[t:t + 1], isa=isa, threads=1)
            np.testing.assert_array_equal(full[t], one[0], err_msg=f"{isa} row {t}")


@pytest.mark.parametrize("typ", [t for t in TYPES if t not in ACT32_TYPES])
def test_dot_within_float32_bound(typ):
    """|y - y64| <= gamma_n * sum|w x| with gamma_n = n*u/(1-n*u), u = 2^-24 (Higham's bound for any summation
    order; our order sums n/16 + 4 terms per lane path, well inside it) plus the weight decoding being exact."""
    rng = fresh_rng()
    rows, cols = 16, 512
    raw = _weights(rng, typ, rows, cols)
    W = gguf.quants.dequantize(raw.reshape(rows, -1), TYPES[typ]).astype(np.float64)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    y = _core.matmul(raw, typ, rows, cols, x, isa=_core.best_isa())
    y64 = x.astype(np.float64) @ W.T
    u = 2.0 ** -24
    n = cols // 16 + 4
    bound = n * u / (1 - n * u) * (np.abs(x.astype(np.float64)) @ np.abs(W).T)
    assert np.all(np.abs(y - y64) <= bound + 1e-30)


@pytest.mark.parametrize("typ", sorted(ACT32_TYPES))
def test_dot_within_int8_activation_bound(typ):
    """Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 multiply int8 activations per 32 values (matmul.h). With w the decoded
    weights (gguf dequantize, float64) and x the float activations:
        |y - w.x| <= sum_i |w_i| * dx_b(i) * (1/2 + 2^-20)       activation rounding, |x - dx*q| <= dx/2
                   + gamma_n * sum_i |w_i| * |x_i| * (1 + 1/254)   float32 rounding of the lane sums
                   + 2^-23 * sum_i |w_i x_i|                       dequantize's own rounding of s*v + m (Q4_1, Q5_1)
    with gamma_n = n*u/(1-n*u), u = 2^-24, n = blocks/4 * 2 + 6 (products s*dx, m*dx, one or two fma per block of
    the lane, the 4-level tree) taken generously as 2*blocks + 8. And the kernel equals the float64 product with the
    activations quantized as act32.h states up to float32 rounding."""
    rng = fresh_rng()
    rows, cols = 24, 1024
    raw = _weights(rng, typ, rows, cols)
    W = gguf.quants.dequantize(raw.reshape(rows, -1), TYPES[typ]).astype(np.float64)
    x = (rng.standard_normal((4, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
    xq, dx = q8_reference(x, 32)
    absW = np.abs(W).T
    for isa in PATHS:
        y = _core.matmul(raw, typ, rows, cols, x, isa=isa)
        assert np.all(np.abs(y - xq @ W.T) <= 1e-5 * (np.abs(xq) @ absW) + 1e-30), isa
    y64 = x.astype(np.float64) @ W.T
    u, n = 2.0 ** -24, 2 * cols // 32 + 8
    absWx = np.abs(x.astype(np.float64)) @ absW
    bound = ((np.repeat(dx, 32, axis=1) * (0.5 + 2.0 ** -20)) @ absW + n * u / (1 - n * u) * absWx * (1 + 1 / 254)
             + 2.0 ** -23 * absWx)
    err = np.abs(y - y64)
    assert np.all(err <= bound), f"worst err/bound {np.max(err / bound):.3f}"
    assert np.max(err / bound) > 0.01  # the bound is not vacuous: the activation term dominates


@pytest.mark.parametrize("isa", ISAS)
def test_activation32_quantizers_agree(isa):
    rng = fresh_rng()
    x = (rng.standard_normal((5, 1024)) * rng.uniform(1e-3, 1e3, (5, 1))).astype(np.float32)
    x[1, :32] = 0.0   # an all-zero block
    x[2, 3] = 1e30    # a huge outlier
    x[3, 40] = -1e-38  # a block of one tiny value
    x[3, 32:40] = 0.0
    x[3, 41:64] = 0.0
    assert _core.quantize_act32(x, isa) == _core.quantize_act32(x, "scalar")


def test_activation32_quantizer_is_q8_0():
    """q = round_half_even(x * 127/amax) per 32-block, dx = amax/127 (act32.h)."""
    rng = fresh_rng()
    x = rng.standard_normal((3, 96)).astype(np.float32)
    q, dx = _core.quantize_act32(x)
    q = np.array(q)
    for t in range(3):
        for b in range(3):
            xb = x[t, 32 * b:32 * (b + 1)]
            amax = np.abs(xb).max()
            np.testing.assert_array_equal(q[t, 32 * b:32 * (b + 1)], np.rint(xb * (np.float32(127) / amax)).astype(int))
            assert dx[t][b] == np.float32(amax / np.float32(127))


def test_force_isa_refuses_missing():
    if _core.best_isa() == "avx512":
        pytest.skip("this CPU has every path")
    with pytest.raises(ValueError, match="does not support"):
        _core.force_isa("avx512")


@pytest.mark.parametrize("dv", [128, 80, 7])
@pytest.mark.parametrize("read", [True, False])
def test_dn_rows_equal_ref(dv, read):
    # the strip-mined DeltaNet window recurrence against its row-by-row twin, bit for bit, for every
    # split between rows on S and rows on the working copy
    rng = fresh_rng()  # fresh inputs every run
    dk = 128 if dv != 7 else 16
    for T in (1, 3, 8):
        S = rng.standard_normal((dk, dv), dtype=np.float32) * 0.1
        k = rng.standard_normal((T, dk), dtype=np.float32)
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        v = rng.standard_normal((T, dv), dtype=np.float32)
        q = rng.standard_normal((T, dk), dtype=np.float32)
        gates = np.stack([rng.uniform(0.5, 1.0, T), rng.uniform(0.0, 1.0, T)], axis=1).astype(np.float32)
        for n_src in range(T + 1):
            ref = _core.dn_rows(S, k, v, q, gates, n_src, read, True)
            for isa in PATHS:
                prev = _core.active_isa()
                _core.force_isa(isa)
                try:
                    fast = _core.dn_rows(S, k, v, q, gates, n_src, read, False)
                finally:
                    _core.force_isa(prev)
                for a, b in zip(fast, ref):
                    assert np.array_equal(np.asarray(a), np.asarray(b)), (isa, T, n_src)
            if n_src < T:  # the committed S saw exactly the first n_src rows, the working copy all of them
                assert not np.array_equal(np.asarray(fast[0]), np.asarray(fast[1]))


@pytest.mark.parametrize("hd", [64, 128, 256, 48])
@pytest.mark.parametrize("isa", ISAS)
def test_attend_paths(hd, isa):
    # the AVX-512 and AVX2 attention against the scalar twin and float64 (the paths sum in different orders),
    # and every (row, head) output bit-identical whatever rows and heads share the call: a T-row window
    # against the same rows one at a time
    rng = fresh_rng()  # fresh inputs every run
    nh, scale = 2, 1.0 / np.sqrt(hd)
    for n0, T in ((1, 1), (3, 2), (16, 1), (17, 8), (37, 3), (300, 8)):
        q = rng.standard_normal((T * nh, hd), dtype=np.float32)
        k = rng.standard_normal((n0 + T - 1, hd), dtype=np.float32)
        v = rng.standard_normal((n0 + T - 1, hd), dtype=np.float32)
        fast = np.asarray(_core.attend(q, nh, k, v, n0, scale, isa)).reshape(T * nh, hd)
        ref = np.asarray(_core.attend(q, nh, k, v, n0, scale, "scalar")).reshape(T * nh, hd)
        for t in range(T):
            kk, vv = k[:n0 + t].astype(np.float64), v[:n0 + t].astype(np.float64)
            for j in range(nh):
                i = t * nh + j
                s = (q[i].astype(np.float64) @ kk.T) * scale
                p = np.exp(s - s.max())
                exact = (p / p.sum()) @ vv
                for got in (fast[i], ref[i]):
                    assert np.max(np.abs(got - exact)) <= 1e-5 * max(1.0, np.max(np.abs(exact)))
                one = np.asarray(_core.attend(q[i:i + 1], 1, k, v, n0 + t, scale, isa))
                assert np.array_equal(one, fast[i]), (n0, T, t, j)


def test_vexp_accuracy():
    # vexp against float64 exp over the whole useful range: within 2 ulp (relative 2.4e-7)
    x = np.concatenate([np.linspace(-87.0, 88.0, 200001, dtype=np.float32),
                        fresh_rng().standard_normal(100000).astype(np.float32) * 10])
    got = np.asarray(_core.rowop("vexp", x.reshape(1, -1), np.zeros((1, 1), np.float32), "scalar"), dtype=np.float64)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) <= 2.4e-7
    clamped = np.asarray(_core.rowop("vexp", np.array([[-1000.0, 1000.0]], np.float32), np.zeros((1, 1), np.float32), "scalar"))
    assert 0 < clamped[0] < 1e-37 and np.isfinite(clamped[1]) and clamped[1] > 1e38


@pytest.mark.parametrize("name", ["silu", "silu_mul", "mul_silu", "mul_sigmoid", "exp_shift", "conv", "axpy"])
def test_rowops_builds_agree(name):
    # every build of the row loops gives the same bits (fresh random inputs), and matches float64 math
    rng = fresh_rng()  # fresh inputs every run
    x = (rng.standard_normal((7, 1000)) * 6).astype(np.float32)
    y = (rng.standard_normal((7, 1000)) * 6).astype(np.float32)
    if name == "exp_shift":
        y = np.array([[float(x.max())]], np.float32)
    if name == "conv":
        y = rng.standard_normal((4, 1000)).astype(np.float32)
    outs = [np.asarray(_core.rowop(name, x, y, isa)) for isa in PATHS]
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    silu = lambda v: v / (1 + np.exp(-v))
    if name == "conv":
        T = x.shape[0] - 3
        s = sum(yd[j] * xd[j:j + T] for j in range(4))
        mag = sum(np.abs(yd[j] * xd[j:j + T]) for j in range(4)).reshape(-1)  # float32 sum rounding
        assert np.all(np.abs(outs[0] - silu(s).reshape(-1)) <= 2e-6 * np.abs(silu(s).reshape(-1)) + 1e-6 * mag)
        return
    if name == "axpy":  # a float32 multiply, then a float32 add: exactly numpy's float32 arithmetic
        assert np.array_equal(outs[0].reshape(x.shape), x + np.float32(0.7) * y)
        return
    else:
        want = {"silu": silu(xd), "silu_mul": silu(xd) * yd, "mul_silu": xd * silu(yd),
                "mul_sigmoid": xd / (1 + np.exp(-yd)), "exp_shift": np.exp(xd - yd[0, 0])}[name].reshape(-1)
    assert np.allclose(outs[0], want, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("typ", sorted(BLOCK32 - {"Q8_0"}))
def test_random_blocks32_dequantize_and_multiply(typ):
    """Uniform random codes and high bits (every pattern occurs, unlike in quantized data: MXFP4's -0, every
    Q5 bit) with synth's random scales: dequantization bit-exact with gguf.quants, fast paths equal to the
    scalar twin."""
    rng = fresh_rng()
    rows, cols = 40, 256
    raw = synth.random_blocks32(rng, TYPES[typ], rows * cols // 32, scale=float(rng.uniform(0.01, 2.0)))
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), TYPES[typ])
    np.testing.assert_array_equal(_core.dequantize(raw.ravel(), typ, rows * cols).reshape(rows, cols), ref)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    for T in (1, 4, 8):
        want = _core.matmul(raw.ravel(), typ, rows, cols, x[:T], isa="scalar")
        for isa in ISAS:
            np.testing.assert_array_equal(_core.matmul(raw.ravel(), typ, rows, cols, x[:T], isa=isa), want,
                                          err_msg=f"{typ} {isa} T={T}")


@pytest.mark.parametrize("typ", ["q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4"])
def test_block32_model_windows_equal_serial(tmp_path, typ):
    """A synthetic model of each 32-value block type loads and a window of T rows (T = 3, and 9: two kernel
    passes) gives exactly the logits of serial decoding."""
    from strata_py.model import Model
    model = Model.load(synth.write("tiny", tmp_path / f"t-{typ}.gguf", typ, seed=6), threads=2)
    assert_windows_equal_serial(model, windows=(3, 9), seed=12, label=typ)


@pytest.mark.parametrize("hd", [64, 128, 256, 48])
def test_attend_cell_list_equals_gathered_cells(hd):
    # QSA's sparse rows attend to a list of cells: on every path, the same bits as the dense kernel run on
    # those cells gathered in order, and the fast paths' sparse rows within float rounding of the scalar
    # twin's (fresh random inputs and cell sets)
    rng = fresh_rng()
    for n, m in ((40, 7), (300, 37), (1000, 260)):
        k = rng.standard_normal((n, hd), dtype=np.float32)
        v = rng.standard_normal((n, hd), dtype=np.float32)
        q = rng.standard_normal((2, hd), dtype=np.float32)
        cells = np.sort(rng.choice(n, m, replace=False)).astype(np.int32)
        ref = np.asarray(_core.attend(q, 2, k, v, m, 0.125, "scalar", cells.tolist()))
        for isa in PATHS:
            sparse = np.asarray(_core.attend(q, 2, k, v, m, 0.125, isa, cells.tolist()))
            dense = np.asarray(_core.attend(q, 2, k[cells], v[cells], m, 0.125, isa))
            assert np.array_equal(sparse, dense), (isa, n, m)
            assert np.max(np.abs(sparse - ref)) <= 1e-5 * max(1.0, np.max(np.abs(ref))), (isa, n, m)
