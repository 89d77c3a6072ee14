"""K- and IQ-quant kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS):
dequantization bit-exact against gguf-py,
grids equal to gguf-py's, every fast path bit-identical to its scalar `_ref` twin on fresh random blocks,
T-row results equal to 1-row results, dot products within the bound that int8 activations imply, and a
quantized synthetic model: window parity and one layer's matmul against a float64 forward."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from kquant import q8_reference
from seeds import fresh_rng
from strata_py import _core, synth
from window_util import assert_windows_equal_serial

KQ = {"Q2_K": QT.Q2_K, "Q3_K": QT.Q3_K, "Q4_K": QT.Q4_K, "Q5_K": QT.Q5_K, "Q6_K": QT.Q6_K, "IQ2_XXS": QT.IQ2_XXS, "IQ3_XXS": QT.IQ3_XXS,
      "IQ4_XS": QT.IQ4_XS, "IQ2_XS": QT.IQ2_XS, "IQ2_S": QT.IQ2_S, "IQ3_S": QT.IQ3_S, "IQ1_S": QT.IQ1_S, "IQ1_M": QT.IQ1_M}
ISAS = ["avx2", "avx512"][: {"scalar": 0, "avx2": 1, "avx512": 2}[_core.best_isa()]]


def _blocks(rng, typ, rows, cols, wild=False):
    """rows x cols random valid weights; wild=True also randomises the fp16 scales over a wide range."""
    nb = rows * cols // 256
    b = synth.random_blocks(rng, KQ[typ], nb, scale=float(rng.uniform(0.01, 2.0)))
    if wild:  # any finite fp16 scale is valid: magnitudes 2^-14 .. 2^4, either sign
        d = (rng.choice([-1, 1], nb) * 2.0 ** rng.uniform(-14, 4, nb)).astype(np.float16)
        if typ == "IQ1_M":
            synth.set_iq1m_d(b, d)
        else:
            off = {"Q6_K": 208, "Q3_K": 108, "Q2_K": 80}.get(typ, 0)
            b[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return np.ascontiguousarray(b).ravel()


def _deq(raw, typ, rows):
    return gguf.quants.dequantize(raw.reshape(rows, -1), KQ[typ])


@pytest.mark.parametrize("typ", list(KQ))
def test_dequantize_matches_gguf(typ):
    rng = fresh_rng()
    for wild in (False, True):
        raw = _blocks(rng, typ, 8, 512, wild)
        np.testing.assert_array_equal(_core.dequantize(raw, typ, 8 * 512), _deq(raw, typ, 8).ravel())


@pytest.mark.parametrize("typ", ["IQ2_XS", "IQ2_S", "IQ3_S", "IQ1_S", "IQ1_M"])
def test_every_grid_entry_matches_gguf(typ):
    """1024 random blocks look up each entry of the type's grid (512-2048 entries, csrc/kernels/iq_tables.h)
    many times over (a missed entry: probability < 1e-6): dequantization bit-exact with gguf-py's grids."""
    rng = fresh_rng()
    raw = np.ascontiguousarray(synth.random_blocks(rng, KQ[typ], 1024, scale=1.0)).ravel()
    np.testing.assert_array_equal(_core.dequantize(raw, typ, 1024 * 256), _deq(raw, typ, 1024).ravel())


def test_iq4_values_equal_gguf():
    """A block whose sixteen codes run over 0..15 in every sub-block, with d = 1 and every scale 33 (ls - 32 = 1),
    dequantizes to IQ4_NL.kvalues (the table kIq4Values in quants.h) in order."""
    b = np.zeros((1, 136), np.uint8)
    b[0, :2] = np.array([1.0], np.float16).view(np.uint8)
    b[0, 2:4] = np.array([0b1010101010101010], np.uint16).view(np.uint8)  # high bits of every ls: 2 -> 32
    b[0, 4:8] = 0x11                                                        # low bits: 1 -> ls = 33
    b[0, 8:] = np.tile(np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8) << 4), 8)
    got = _core.dequantize(b.ravel(), "IQ4_XS", 256).reshape(8, 32)
    want = np.tile(np.asarray(gguf.quants.IQ4_NL.kvalues, np.float32), 2)
    for ib in range(8):
        np.testing.assert_array_equal(got[ib], want)


def test_grids_equal_gguf():
    """The C++ tables (csrc/kernels/iq_tables.h) decode blocks exactly as gguf-py's grid_hex does: a block
    whose grid indices run over all 256 entries with no signs and scale 0 dequantizes to the grid itself."""
    for typ, cls, per in (("IQ2_XXS", gguf.quants.IQ2_XXS, 8), ("IQ3_XXS", gguf.quants.IQ3_XXS, 4)):
        cls.init_grid()
        grid = np.asarray(cls.grid, np.float32).reshape(256, per)
        d = np.array([4.0], np.float16).view(np.uint8)
        if typ == "IQ2_XXS":  # 256 entries = 64 blocks of 8 sub-blocks x 4 indices; db = 4*(0.5)*0.25 = 0.5
            blocks = np.zeros((8, 66), np.uint8)
            blocks[:, :2] = d
            idx = np.arange(256, dtype=np.uint8).reshape(8, 8, 4)
            for b in range(8):
                for ib in range(8):
                    blocks[b, 2 + 8 * ib:2 + 8 * ib + 4] = idx[b, ib]
            want = grid.reshape(-1) * 0.5
        else:  # 8 indices per sub-block, 64 per block; db = 4*0.5*0.5 = 1
            blocks = np.zeros((4, 98), np.uint8)
            blocks[:, :2] = d
            blocks[:, 2:66] = np.arange(256, dtype=np.uint8).reshape(4, 64)
            want = grid.reshape(-1) * 1.0
        got = _core.dequantize(blocks.ravel(), typ, blocks.shape[0] * 256)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, _deq(blocks.ravel(), typ, blocks.shape[0]).ravel())


@pytest.mark.parametrize("isa", ISAS)
def test_activation_quantizers_agree(isa):
    rng = fresh_rng()
    x = (rng.standard_normal((5, 1024)) * rng.uniform(1e-3, 1e3, (5, 1))).astype(np.float32)
    x[1, :256] = 0.0  # an all-zero block
    x[2, 3] = 1e30    # a huge outlier
    ref = _core.quantize_act(x, "scalar")
    fast = _core.quantize_act(x, isa)
    for a, b in zip(ref, fast):
        assert a == b


def test_activation_quantizer_is_q8k():
    """q = round_half_even(x * 127/amax) per 256-block, dx = amax/127, bsum = sums of q over 32 values."""
    rng = fresh_rng()
    x = rng.standard_normal((3, 512)).astype(np.float32)
    q, dx, bs = _core.quantize_act(x)
    q = np.array(q)
    for t in range(3):
        for b in range(2):
            xb = x[t, 256 * b:256 * (b + 1)]
            amax = np.abs(xb).max()
            want = np.rint(xb * (np.float32(127) / amax)).astype(int)
            np.testing.assert_array_equal(q[t, 256 * b:256 * (b + 1)], want)
            assert dx[t][b] == np.float32(amax / np.float32(127))
            np.testing.assert_array_equal(bs[t][8 * b:8 * b + 8], want.reshape(8, 32).sum(1))


@pytest.mark.parametrize("typ", list(KQ))
@pytest.mark.parametrize("isa", ISAS)
def test_fast_paths_equal_ref(typ, isa):
    rng = fresh_rng()  # fresh inputs every run
    for cols in (256, 512, 1280):
        rows = int(rng.integers(1, 50))
        raw = _blocks(rng, typ, rows, cols, wild=bool(rng.integers(0, 2)))
        for T in (1, 2, 3, 5, 8, 11, 19, 37):  # 11, 19, 37: several passes (the panel paths), a partial last one
            x = (rng.standard_normal((T, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
            ref = _core.matmul(raw, typ, rows, cols, x, isa="scalar")
            fast = _core.matmul(raw, typ, rows, cols, x, isa=isa, threads=2)
            np.testing.assert_array_equal(fast, ref, err_msg=f"{typ} {isa} cols={cols} T={T}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act_type", ["Q4_K", "IQ2_XXS"])
def test_q6k_rows_prepared_for_another_type_equal_ref(act_type, isa):
    """An MoE expert's up matrix multiplies the rows prepared for its gate (moe.cpp): Q6_K rows prepared for
    another type (on AVX2 without the pair sums its unsigned decode windows take) give the scalar kernel's bits."""
    rng = fresh_rng()
    rows, cols = int(rng.integers(1, 40)), 512
    raw = _blocks(rng, "Q6_K", rows, cols)
    for T in (1, 2, 3, 5, 8, 11):
        x = rng.standard_normal((T, cols)).astype(np.float32)
        ref = _core.matmul(raw, "Q6_K", rows, cols, x, isa="scalar")
        got = _core.matmul(raw, "Q6_K", rows, cols, x, isa=isa, act_type=act_type)
        np.testing.assert_array_equal(got, ref, err_msg=f"{act_type} {isa} T={T}")
    own = _core.matmul(raw, "Q6_K", rows, cols, x, isa=isa, act_type="Q6_K")
    np.testing.assert_array_equal(own, ref)


@pytest.mark.parametrize("typ", list(KQ))
def test_rows_independent_of_T(typ):
    rng = fresh_rng()
    rows, cols = 37, 768
    raw = _blocks(rng, typ, rows, cols)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    for isa in ["scalar", *ISAS]:
        full = _core.matmul(raw, typ, rows, cols, x, isa=isa, threads=2)
        for t in range(8):
            one = _core.matmul(raw, typ, rows, cols, x[t:t + 1], isa=isa, threads=1)
            np.testing.assert_array_equal(full[t], one[0], err_msg=f"{isa} row {t}")


@pytest.mark.parametrize("typ", list(KQ))
def test_dot_within_int8_activation_bound(typ):
    """With w the exactly decoded weights (gguf dequantize, float64) and x the float activations:
        |y - w.x| <= sum_i |w_i| * dx_b(i) * (1/2 + 2^-20)       activation rounding, |x - dx*q| <= dx/2
                   + gamma_n * sum_i |w_i| * |x_i| * (1 + 1/254)   float32 rounding of the block sums
                   + 2^-23 * sum_i |w_i x_i|                       dequantize's own float32 rounding of w
    with gamma_n = n*u/(1-n*u), u = 2^-24, n = 2*blocks + 8 (a product d*dx, one fma per block and lane,
    the 4-level tree, the min term). The integer lane sums are exact."""
    rng = fresh_rng()
    rows, cols = 24, 1024
    raw = _blocks(rng, typ, rows, cols)
    W = _deq(raw, typ, rows).astype(np.float64)
    x = rng.standard_normal((4, cols)).astype(np.float32)
    y = _core.matmul(raw, typ, rows, cols, x, isa=_core.best_isa())
    x64 = x.astype(np.float64)
    y64 = x64 @ W.T
    _, dx, _ = _core.quantize_act(x)
    dxe = np.repeat(np.array(dx, np.float64), 256, axis=1)  # (4, cols)
    u = 2.0 ** -24
    n = 2 * cols // 256 + 8
    gam = n * u / (1 - n * u)
    absWx = np.abs(x64) @ np.abs(W).T
    bound = (dxe * (0.5 + 2.0 ** -20)) @ np.abs(W).T + gam * absWx * (1 + 1 / 254) + 2.0 ** -23 * absWx
    err = np.abs(y - y64)
    assert np.all(err <= bound), f"worst err/bound {np.max(err / bound):.3f}"
    # and the bound is not vacuous: the activation term dominates, errors are a fair fraction of it
    assert np.max(err / bound) > 0.01


@pytest.mark.parametrize("typ", ["q4_k", "iq2_xs", "iq2_s", "iq3_s", "iq1_s", "iq1_m"])
def test_window_parity(tmp_path, typ):
    """A window of T rows gives exactly the logits of serial decoding (engine core II), on a synthetic model of
    the type."""
    from strata_py.model import Model
    model = Model.load(synth.write("tiny", tmp_path / f"tiny-{typ}.gguf", typ, seed=4), threads=2)
    assert_windows_equal_serial(model, label=typ)


@pytest.mark.parametrize("typ", ["q2_k", "q3_k", "q4_k", "q4_k_m", "q5_k", "q6_k", "iq2_xxs", "iq3_xxs", "iq4_xs", "iq2_xs",
                                 "iq2_s", "iq3_s", "iq1_s", "iq1_m"])
def test_synthetic_model_loads_and_matmul_matches_float64(tmp_path, typ):
    """Every synthetic K/IQ model loads; its first expert matrix run through the kernel equals a numpy float64
    product of the dequantized weights with the activations quantized as quants.h states (q8_reference) up to
    float32 rounding, and the float64 product with the unquantized activations within the bound the int8
    rounding implies (|x - dx*q| <= dx/2 per value, dx = amax/127 per 256-block)."""
    from strata_py.model import Model
    path = synth.write("tiny", tmp_path / f"t-{typ}.gguf", typ, seed=5)
    m = Model.load(path, threads=2)
    s = m.session(n_ctx=32)
    logits = s.run([1, 2, 3])
    assert np.all(np.isfinite(logits))
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_up_exps.weight")
    name = t.tensor_type.name
    rows, cols = int(t.shape[1]), int(t.shape[0])
    raw = np.ascontiguousarray(np.asarray(t.data)[0]).view(np.uint8).ravel()
    W = _deq(raw, name, rows).astype(np.float64)
    x = np.random.default_rng(0).standard_normal((3, cols)).astype(np.float32)
    xq, dx = q8_reference(x)
    yq = xq @ W.T
    scale = np.abs(xq) @ np.abs(W).T
    for isa in ["scalar", *ISAS]:  # each path's own activation quantizer is checked, not only the fastest
        y = _core.matmul(raw, name, rows, cols, x, isa=isa)
        assert np.all(np.abs(y - yq) <= 1e-5 * scale + 1e-30), (isa, np.max(np.abs(y - yq) / scale))
    y64 = x.astype(np.float64) @ W.T
    bound = (np.repeat(dx, 256, axis=1) / 2) @ np.abs(W).T  # sum over values of |w| * dx/2
    assert np.all(np.abs(y - y64) <= bound * (1 + 1e-5) + 1e-5 * scale)



@pytest.mark.skipif(_core.best_isa() != "avx512", reason="this CPU has no AVX-512")
@pytest.mark.parametrize("typ", list(KQ))
def test_avx512_paths_without_vnni_equal_ref(typ):
    # the kernels kept for AVX-512 CPUs without VNNI (vpmaddwd + vpaddd; no VBMI decoders), T-row and panel paths
    rng = fresh_rng()  # fresh inputs every run
    for cols in (256, 768):
        rows = int(rng.integers(1, 40))
        raw = _blocks(rng, typ, rows, cols, wild=bool(rng.integers(0, 2)))
        for T in (1, 3, 8, 19):
            x = rng.standard_normal((T, cols)).astype(np.float32)
            _core.allow_vnni(False)
            try:
                plain = _core.matmul(raw, typ, rows, cols, x, isa="avx512", threads=2)
            finally:
                _core.allow_vnni(True)
            np.testing.assert_array_equal(plain, _core.matmul(raw, typ, rows, cols, x, isa="scalar"),
                                          err_msg=f"{typ} cols={cols} T={T}")


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU has no AVX2")
@pytest.mark.parametrize("typ", ["IQ2_XXS", "IQ3_XXS"])
def test_avx2_iq_grid_gathers_equal_scalar_loads(typ):
    # the AVX2 IQ kernels take their grid rows by vector gathers on Intel cores and by scalar loads elsewhere
    # (kq_common.h), so test_fast_paths_equal_ref covers only this CPU's choice; here both, against the scalar twin
    rng = fresh_rng()  # fresh inputs every run
    default = _core.gathers_preferred()
    for cols in (256, 768):
        rows = int(rng.integers(1, 40))
        raw = _blocks(rng, typ, rows, cols, wild=bool(rng.integers(0, 2)))
        for T in (1, 3, 8, 19):  # 19: the prompt panels
            x = rng.standard_normal((T, cols)).astype(np.float32)
            ref = _core.matmul(raw, typ, rows, cols, x, isa="scalar")
            try:
                for on in (True, False):
                    _core.prefer_gathers(on)
                    np.testing.assert_array_equal(_core.matmul(raw, typ, rows, cols, x, isa="avx2", threads=2), ref,
                                                  err_msg=f"{typ} T={T} gathers={on}")
            finally:
                _core.prefer_gathers(default)


@pytest.mark.skipif(not _core.has_avx512vbmi(), reason="this CPU has no AVX-512 VBMI")
@pytest.mark.parametrize("typ", ["IQ2_XXS", "IQ3_XXS"])
def test_iq_vbmi_decoders_equal_the_plain_avx512_ones(typ):
    # the AVX-512 path picks the VBMI IQ decoders on this CPU (so test_fast_paths_equal_ref covers them);
    # here the other AVX-512 decoders, kept for CPUs without VBMI, against them and the scalar twin
    rng = fresh_rng()  # fresh inputs every run
    for cols in (256, 768):
        rows = int(rng.integers(1, 40))
        raw = _blocks(rng, typ, rows, cols, wild=bool(rng.integers(0, 2)))
        for T in (3, 19):  # 19: the prompt panels (IQ2_XXS's byte panel decodes with or without VBMI)
            x = rng.standard_normal((T, cols)).astype(np.float32)
            vbmi = _core.matmul(raw, typ, rows, cols, x, isa="avx512", threads=2)
            _core.allow_vbmi(False)
            try:
                plain = _core.matmul(raw, typ, rows, cols, x, isa="avx512", threads=2)
            finally:
                _core.allow_vbmi(True)
            np.testing.assert_array_equal(vbmi, plain)
            np.testing.assert_array_equal(vbmi, _core.matmul(raw, typ, rows, cols, x, isa="scalar"))
