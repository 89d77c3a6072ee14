"""The model forward on the GPU (issue 19, third milestone). Every layer operation the backend forward issues
(backend.h: conv + SiLU, DeltaNet gates with glibc's expf / log1pf twins, all-head DeltaNet rows, gated norm,
norm + RoPE, the output gate, SwiGLU, the MoE combine with the shared-expert gate, Qwen3.5's head untiling, expert
products over a device-side selection) equals the CPU backend's bit for bit on fresh random inputs, and a T-row call
equals T one-row calls. The GPU session's logits and hidden rows equal the CPU session's bit for bit on the tiny
models, the shipped default model, a qwen35moe model and a Q4_K model, for prompt windows, T = 1 and windows of
T = 1..16 with random keeps; greedy and sampled decoding give the CPU's tokens, and suffix-drafted decoding on the
GPU gives plain decoding's. The CPU side runs its scalar kernels (force_isa): attention's AVX-512 / AVX2 paths sum
in their own orders (kernels/attend.h), the GPU's attention is attend_ref's. Skipped where no CUDA device is usable."""
from __future__ import annotations

import numpy as np
import pytest

from backend_util import assert_same, continue_equal, decode_equal, tiny_qwen35moe, windows_equal
from cuda_util import CUDA_TYPES, bits, iq2_rows, needs_cuda, pdl, prompt_rows, switched, tensor_cores, weights
from seeds import fresh_rng
from strata_py import _core
from strata_py.model import Model

pytestmark = needs_cuda


def _op(backend, name, f, i=(), n=(), d=()):
    fo, io = _core.backend_layer_op(backend, name, [np.ascontiguousarray(a, np.float32).ravel() for a in f],
                                    [np.ascontiguousarray(a, np.int32).ravel() for a in i], [int(v) for v in n],
                                    [float(v) for v in d])
    return [np.asarray(x, np.float32) for x in fo], [np.asarray(x, np.int32) for x in io]


def both(name, f, i=(), n=(), d=()):
    """The operation on the CPU backend and on the GPU: every array after it, bit for bit. Returns the CPU's."""
    a, ai = _op("cpu", name, f, i, n, d)
    b, bi = _op("cuda", name, f, i, n, d)
    for j, (x, y) in enumerate(zip(a, b)):
        assert np.array_equal(bits(x), bits(y)), f"{name}: float array {j} differs at {np.argwhere(bits(x) != bits(y))[:3].ravel().tolist()}"
    for j, (x, y) in enumerate(zip(ai, bi)):
        assert np.array_equal(x, y), f"{name}: int array {j} differs"
    return a


def nan(*shape):
    return np.full(shape, np.nan, np.float32)


# ---------------------------------------------------------------- elementwise and per-row operations
def test_add_silu_mul_mul_sigmoid_equal_cpu():
    rng = fresh_rng()
    n = int(rng.integers(1, 5000))
    x, y = (rng.standard_normal(n) * 4).astype(np.float32), (rng.standard_normal(n) * 4).astype(np.float32)
    both("add", [x, y], n=[n])
    both("silu_mul", [x * 6, y], n=[n])
    rows, hd = int(rng.integers(1, 9)), 64
    o, g = rng.standard_normal((rows, hd)).astype(np.float32), (rng.standard_normal((rows, 2 * hd)) * 5).astype(np.float32)
    got = both("mul_sigmoid_rows", [o, g[:, hd:].copy().ravel()], n=[hd, hd, hd, rows])[0].reshape(rows, hd)
    for r in range(rows):  # each row alone
        one = _op("cuda", "mul_sigmoid_rows", [o[r], g[r, hd:]], n=[hd, hd, hd, 1])[0][0]
        assert np.array_equal(bits(one), bits(got[r]))


def test_add_rmsnorm_equals_cpu_and_rows():
    """The residual add with the next norm in one kernel == add then rmsnorm on the CPU; a row alone == in T rows."""
    rng = fresh_rng()
    T, n = int(rng.integers(1, 17)), int(rng.choice([64, 2048, 3000, 9000]))  # 9000: over the staged row
    x, y = (rng.standard_normal((T, n)) * 3).astype(np.float32), rng.standard_normal((T, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    out = both("add_rmsnorm", [x, y, w, nan(T, n)], n=[n, T], d=[1e-6])
    t = int(rng.integers(0, T))
    one = _op("cuda", "add_rmsnorm", [x[t], y[t], w, nan(1, n)], n=[n, 1], d=[1e-6])[0]
    assert np.array_equal(bits(one[0]), bits(out[0].reshape(T, n)[t]))
    assert np.array_equal(bits(one[3]), bits(out[3].reshape(T, n)[t]))


@pytest.mark.parametrize("K", [2, 4])
def test_conv_silu_equals_cpu_and_rows(K):
    rng = fresh_rng()
    T, cd = int(rng.integers(1, 17)), int(rng.integers(1, 700))
    hist = rng.standard_normal((K - 1 + T, cd)).astype(np.float32)
    w = rng.standard_normal((K, cd)).astype(np.float32)
    out = both("conv_silu", [hist, w, nan(T, cd)], n=[T, cd, cd, K])[2].reshape(T, cd)
    for t in range(T):
        one = _op("cuda", "conv_silu", [hist[t:t + K], w, nan(1, cd)], n=[1, cd, cd, K])[0][2]
        assert np.array_equal(bits(one), bits(out[t])), f"row {t}"


@pytest.mark.parametrize("dk", [64, 128])
def test_dn_gates_equal_cpu_and_rows(dk):
    """Gate inputs over a wide range (softplus' threshold at 20, exp's overflow and underflow): glibc's expf and
    log1pf on the card give the host libm's bits."""
    rng = fresh_rng()
    T, nk, r = int(rng.integers(1, 17)), 4, 2
    nv = nk * r
    cd = 2 * nk * dk + nv * 32
    conv = rng.standard_normal((T, cd)).astype(np.float32)
    ba = (rng.standard_normal((T, 2 * nv)) * rng.choice([0.5, 5, 30, 120], (T, 2 * nv))).astype(np.float32)
    ssm_a = -np.exp(rng.uniform(-2, 2, nv)).astype(np.float32)
    dt = rng.uniform(-1, 1, nv).astype(np.float32)
    out = both("dn_gates", [conv, ba, ssm_a, dt, nan(T, nv), nan(T, nv)], n=[cd, T, nk, nv, dk])
    for t in range(T):
        one = _op("cuda", "dn_gates", [conv[t], ba[t], ssm_a, dt, nan(1, nv), nan(1, nv)], n=[cd, 1, nk, nv, dk])[0]
        for j in (0, 4, 5):
            assert np.array_equal(bits(one[j]), bits(out[j].reshape(T, -1)[t])), f"row {t}, array {j}"


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dk,K", [(128, 4), (64, 2), (48, 1)])
def test_dn_conv_gates_equal_cpu(fused, dk, K):
    """backend.h dn_conv_gates (the conv over the committed state and the window's raw rows, the gates, then the new
    state in place or the fold's replay rows): the CPU backend's bits on the card, as one kernel (windows of up to 16
    rows; 17+ take the default sequence there) and as the default sequence of copies and kernels
    (cuda_prefer_dn_conv_fused); the state as it stands after the call included, so that a thread overwriting state
    rows another row still reads would show."""
    rng = fresh_rng()
    nk, r = 4, 2
    nv = nk * r
    with switched(_core.cuda_prefer_dn_conv_fused, fused, True):
        for T in (1, 2, int(rng.integers(3, 16)), 16, 17):
            for in_place in (1, 0):
                cd = 2 * nk * dk + nv * int(rng.integers(16, 80))
                raw = rng.standard_normal((T, cd)).astype(np.float32)
                state = rng.standard_normal((max(K - 1, 1), cd)).astype(np.float32)
                w = rng.standard_normal((K, cd)).astype(np.float32)
                ba = (rng.standard_normal((T, 2 * nv)) * rng.choice([0.5, 5, 30], (T, 2 * nv))).astype(np.float32)
                ssm_a = -np.exp(rng.uniform(-2, 2, nv)).astype(np.float32)
                dt = rng.uniform(-1, 1, nv).astype(np.float32)
                f = [raw, state, nan(K - 1 + T, cd), w, ba, ssm_a, dt, nan(T, cd), nan(T, nv), nan(T, nv),
                     nan(T, cd), nan(T, nv), nan(T, nv), nan(T, cd)]
                n = [T, cd, K, nk, nv, dk, in_place]
                out, got = _op("cpu", "dn_conv_gates", f, n=n)[0], _op("cuda", "dn_conv_gates", f, n=n)[0]
                for j in range(len(f)):  # (hist, array 2, is scratch: the kernel needs none)
                    assert j == 2 or np.array_equal(bits(out[j]), bits(got[j])), f"array {j}, T = {T}, {in_place=}"
                # against the operations it stands for, on the CPU backend
                hist = np.concatenate([state[:K - 1], raw])
                conv = _op("cpu", "conv_silu", [hist, w, nan(T, cd)], n=[T, cd, cd, K])[0][2]
                g = _op("cpu", "dn_gates", [conv, ba, ssm_a, dt, nan(T, nv), nan(T, nv)], n=[cd, T, nk, nv, dk])[0]
                label = f"T = {T}, in_place = {in_place}"
                assert np.array_equal(bits(out[7]), bits(g[0])), label
                assert np.array_equal(bits(out[8]), bits(g[4])) and np.array_equal(bits(out[9]), bits(g[5])), label
                if in_place:
                    assert np.array_equal(bits(out[1][:(K - 1) * cd]), bits(hist[T:].ravel())), label
                else:
                    assert np.array_equal(bits(out[1]), bits(state.ravel())), label
                    for j, want in ((10, g[0]), (11, g[4]), (12, g[5]), (13, raw)):
                        assert np.array_equal(bits(out[j]), bits(want.ravel())), f"{label}, replay array {j}"


def _dn_case(rng, T, nk, r, dk, dv):
    nv = nk * r
    k = rng.standard_normal((T, nk, dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=2, keepdims=True)
    q = (rng.standard_normal((T, nk, dk)) / np.sqrt(dk)).astype(np.float32)
    v = rng.standard_normal((T, nv, dv)).astype(np.float32)
    eg = rng.uniform(0.6, 1.0, (T, nv)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (T, nv)).astype(np.float32)
    S = (rng.standard_normal((nv, dk, dv)) * 0.3).astype(np.float32)
    return S, k, v, q, eg, beta


@pytest.mark.parametrize("dk,dv", [(128, 128), (128, 80), (64, 64), (32, 48)])
@pytest.mark.parametrize("mode", ["in_place", "window", "partial", "partial-mid", "replay"])
@pytest.mark.parametrize("rows", ["short", "long"])
def test_dn_heads_equal_cpu_and_rows(dk, dv, mode, rows):
    """For dk = 128 over 2+ rows both kernels (deltanet.cu k_dn_heads_duo, the default, and k_dn_heads_split): the
    same bits as the CPU and the one-row calls; rows "long" wrap the duo kernel's ring of staged rows."""
    rng = fresh_rng()
    T, nk, r = int(rng.integers(1, 8) if rows == "short" else rng.integers(8, 41)), 2, 2
    nv = nk * r
    S, k, v, q, eg, beta = _dn_case(rng, T, nk, r, dk, dv)
    n_src = {"in_place": T, "window": 0, "partial": 1, "partial-mid": T // 2 + 1, "replay": T}[mode]
    has_o = mode != "replay"
    f = [S, nan(nv, dk, dv), k, v, q, eg, beta, nan(T, nv, dv)]
    n = [nk * dk, nv * dv, nk * dk, nv * dv, nk, nv, dk, dv, T, n_src, int(has_o), int(n_src < T)]
    out = both("dn_heads", f, n=n)
    with switched(_core.cuda_prefer_dn_duo, False, True):  # k_dn_heads_split at every T: the same bits
        split = _op("cuda", "dn_heads", f, n=n)[0]
    for j in (0, 1, 7):
        assert np.array_equal(bits(split[j]), bits(out[j])), f"k_dn_heads_split against the default, array {j}"
    if mode == "in_place":  # T one-row calls carrying S
        S1 = S
        for t in range(T):
            one = _op("cuda", "dn_heads", [S1, nan(1), k[t], v[t], q[t], eg[t], beta[t], nan(nv, dv)],
                      n=[0, 0, 0, 0, nk, nv, dk, dv, 1, 1, 1, 0])[0]
            assert np.array_equal(bits(one[7]), bits(out[7].reshape(T, -1)[t])), f"row {t}"
            S1 = one[0]
        assert np.array_equal(bits(S1), bits(out[0]))


@pytest.mark.parametrize("typ", ["IQ2_XXS", "Q4_K", "Q4_0", "Q8_0"])
def test_gated_norm_quantizes_for_the_product_after_it(typ):
    """gated_norm_rows told the product that reads its rows next (DeltaNet's ssm_out): on the card the norm's kernel
    quantizes them for it (int8-activation types, rows of whole blocks), and the product takes that quantization;
    the norm's rows and the product's equal the CPU backend's bit for bit, over heads of 128 and 64 floats."""
    rng = fresh_rng()
    for n, heads in ((128, 4), (64, 8), (128, 6)):
        T, rows, cols = int(rng.integers(1, 17)), int(rng.integers(32, 300)), n * heads
        x = rng.standard_normal((T, cols)).astype(np.float32)
        w = rng.standard_normal(n).astype(np.float32)
        z = (rng.standard_normal((T, cols)) * 3).astype(np.float32)
        wb = weights(rng, typ, rows, cols)
        words = np.concatenate([wb, np.zeros((-wb.size) % 4, np.uint8)]).view(np.int32)
        qt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}[typ]
        for sig in (0, 1):
            both("gated_norm_matmul", [x, w, z, nan(T, cols), nan(T, rows)], i=[words],
                 n=[n, heads, T, sig, qt, rows], d=[1e-6])


def test_gated_norm_and_norm_rope_equal_cpu_and_rows():
    rng = fresh_rng()
    rows, n = int(rng.integers(1, 40)), 128
    x, z = rng.standard_normal((rows, n)).astype(np.float32), (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    for sig in (0, 1):
        out = both("gated_norm", [x, w, z, nan(rows, n)], n=[n, rows, sig], d=[1e-6])[3].reshape(rows, n)
        one = _op("cuda", "gated_norm", [x[-1], w, z[-1], nan(1, n)], n=[n, 1, sig], d=[1e-6])[0][3]
        assert np.array_equal(bits(one), bits(out[-1]))
    T, nh, hd, n_rot, pos0 = int(rng.integers(1, 17)), 3, 64, 16, int(rng.integers(0, 50))
    xs = rng.standard_normal((T, nh, 2 * hd)).astype(np.float32)  # heads at stride 2 hd (q | gate)
    half = n_rot // 2
    cs = rng.uniform(-1, 1, (pos0 + T, half)).astype(np.float32)
    sn = rng.uniform(-1, 1, (pos0 + T, half)).astype(np.float32)
    wq = rng.standard_normal(hd).astype(np.float32)
    out = both("norm_rope", [xs, wq, cs, sn], n=[nh * 2 * hd, 2 * hd, T, nh, hd, n_rot, pos0], d=[1e-6])[0]
    t = T - 1
    one = _op("cuda", "norm_rope", [xs[t], wq, cs, sn], n=[nh * 2 * hd, 2 * hd, 1, nh, hd, n_rot, pos0 + t], d=[1e-6])[0][0]
    assert np.array_equal(bits(one), bits(out.reshape(T, -1)[t]))


@pytest.mark.parametrize("shared", [0, 1])
def test_moe_combine_equals_cpu_and_rows(shared):
    rng = fresh_rng()
    T, k, H = int(rng.integers(1, 17)), int(rng.integers(1, 11)), int(rng.choice([256, 1024, 2048, 3000]))
    yg = rng.standard_normal((T, k, H)).astype(np.float32)
    wt = rng.dirichlet(np.ones(k), T).astype(np.float32)
    sh = rng.standard_normal((T, H)).astype(np.float32)
    gate = (rng.standard_normal(H) * 0.2).astype(np.float32)
    x = (rng.standard_normal((T, H)) * rng.choice([0.1, 1, 5])).astype(np.float32)
    out = both("moe_combine", [yg, wt, sh, gate, x, nan(T, H)], n=[T, k, H, shared])[5].reshape(T, H)
    t = int(rng.integers(0, T))
    one = _op("cuda", "moe_combine", [yg[t], wt[t], sh[t], gate, x[t], nan(1, H)], n=[1, k, H, shared])[0][5]
    assert np.array_equal(bits(one), bits(out[t]))


def test_moe_shared_gate_ahead_equals_cpu_combine():
    """The shared gates issued ahead (moe_shared_gate, then moe_combine) give the CPU's combine bit for bit."""
    rng = fresh_rng()
    T, k, H = int(rng.integers(1, 17)), int(rng.integers(1, 11)), int(rng.choice([256, 2048, 3000]))
    yg = rng.standard_normal((T, k, H)).astype(np.float32)
    wt = rng.dirichlet(np.ones(k), T).astype(np.float32)
    sh = rng.standard_normal((T, H)).astype(np.float32)
    gate = (rng.standard_normal(H) * 0.2).astype(np.float32)
    x = (rng.standard_normal((T, H)) * rng.choice([0.1, 1, 5])).astype(np.float32)
    f = [yg, wt, sh, gate, x, nan(T, H)]
    want = _op("cpu", "moe_combine", f, n=[T, k, H, 1])[0][5]
    got = _op("cuda", "moe_combine_pre", f, n=[T, k, H, 1])[0][5]
    assert np.array_equal(bits(want), bits(got))


def test_position_ops_of_recorded_steps():
    """norm_rope_at == norm_rope at the position read from memory; kv_store puts rows at *pos; attend_at with the
    cell count read from memory (launches sized for more) == attend over exactly those cells."""
    rng = fresh_rng()
    T, nh, hd, n_rot, pos0 = int(rng.integers(1, 17)), 3, 64, 16, int(rng.integers(0, 300))
    xs = rng.standard_normal((T, nh, 2 * hd)).astype(np.float32)
    half = n_rot // 2
    cs = rng.uniform(-1, 1, (pos0 + T, half)).astype(np.float32)
    sn = rng.uniform(-1, 1, (pos0 + T, half)).astype(np.float32)
    wq = rng.standard_normal(hd).astype(np.float32)
    n = [nh * 2 * hd, 2 * hd, T, nh, hd, n_rot]
    want = _op("cpu", "norm_rope", [xs, wq, cs, sn], n=n + [pos0], d=[1e-6])[0][0]
    got = _op("cuda", "norm_rope_at", [xs, wq, cs, sn], i=[[pos0]], n=n + [0], d=[1e-6])[0][0]
    assert np.array_equal(bits(want), bits(got))

    width, cells = 48, pos0 + T + 5
    k, v = rng.standard_normal((T, width)).astype(np.float32), rng.standard_normal((T, width)).astype(np.float32)
    kc, vc = rng.standard_normal((cells, width)).astype(np.float32), rng.standard_normal((cells, width)).astype(np.float32)
    out = _op("cuda", "kv_store", [k, v, kc, vc], i=[[pos0]], n=[T, width])[0]
    wk, wv = kc.copy(), vc.copy()
    wk[pos0:pos0 + T], wv[pos0:pos0 + T] = k, v
    assert np.array_equal(bits(out[2]), bits(wk.ravel())) and np.array_equal(bits(out[3]), bits(wv.ravel()))

    nq, hd2, n0 = 2, 128, pos0 + 1
    q = rng.standard_normal((T * nq, hd2)).astype(np.float32)
    kk = rng.standard_normal((n0 + T - 1, hd2)).astype(np.float32)
    vv = rng.standard_normal((n0 + T - 1, hd2)).astype(np.float32)
    want = _core.backend_attend("cuda", q, nq, kk, vv, n0, 1.0 / np.sqrt(hd2))
    n_cap = (n0 + 255) // 256 * 256
    got = _op("cuda", "attend_at", [q, kk, vv, nan(T * nq, hd2)], i=[[n0]], n=[nq, hd2, n_cap])[0][3]
    assert np.array_equal(bits(np.asarray(want, np.float32).ravel()), bits(got))


@pytest.mark.parametrize("typ", ["Q4_K", "IQ2_XXS", "Q8_0"])
def test_products_reuse_a_quantization_only_of_unchanged_rows(typ):
    """Two products of the same rows share one quantization; an operation in between that changes the rows makes
    the second quantize again (CPU == GPU bit for bit either way)."""
    rng = fresh_rng()
    rows, cols, T = int(rng.integers(1, 70)), 512, int(rng.integers(1, 17))
    w = weights(rng, typ, rows, cols)
    words = np.concatenate([w, np.zeros((-w.size) % 4, np.uint8)]).view(np.int32)
    qt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}[typ]
    x = rng.standard_normal((T, cols)).astype(np.float32)
    dx = rng.standard_normal((T, cols)).astype(np.float32)
    for touch in (0, 1):
        out = both("matmul_seq", [x, nan(T, rows), nan(T, rows), dx], i=[words], n=[qt, rows, cols, T, touch])
        if touch:
            assert not np.array_equal(bits(out[1]), bits(out[2]))
        else:
            assert np.array_equal(bits(out[1]), bits(out[2]))


@pytest.mark.parametrize("typ,feeds", [("Q4_K", 1), ("IQ2_XXS", 1), ("Q4_0", 2), ("MXFP4", 2), ("IQ2_XXS", 2),
                                       ("Q4_0", 0)])
def test_norm_quantizes_for_the_products_after_it(typ, feeds):
    """add_rmsnorm told the next products' activation kind (feeds: 1 the 256-value blocks, 2 the 32-value ones, 0
    none) quantizes its rows in its own kernel for them. The products after it, in one lane or in two lanes of a
    fork, over every row or from row `first` on, give the CPU's bits; and so they do when an operation changes the
    rows between the norm and the products (they quantize again), or when the norm was told another kind."""
    rng = fresh_rng()
    gt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}
    n, rows = int(rng.choice([256, 512, 2048])), int(rng.integers(1, 70))
    w = weights(rng, typ, rows, n)
    words = np.concatenate([w, np.zeros((-w.size) % 4, np.uint8)]).view(np.int32)
    for T in (1, int(rng.integers(2, 9)), int(rng.integers(17, 70))):
        x = (rng.standard_normal((T, n)) * 2).astype(np.float32)
        y = rng.standard_normal((T, n)).astype(np.float32)
        nw = (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)
        for lanes, touch in ((1, 0), (2, 0), (2, 1)):
            first = int(rng.integers(0, T))
            out = both("norm_matmul", [x, y, nw, nan(T, n), nan(T - first, rows), nan(T - first, rows)], i=[words],
                       n=[n, T, gt[typ], rows, feeds, lanes, touch, first], d=[1e-6])
            assert np.array_equal(bits(out[4]), bits(out[5]))  # both lanes' products: the same bits
            assert np.isfinite(out[4]).all()


@pytest.mark.parametrize("pair", [("Q4_K", "Q4_0"), ("MXFP4", "IQ2_XXS"), ("Q4_0", "MXFP4")])
def test_products_of_other_activation_kinds_quantize_again(pair):
    """Products of the same rows by a 256-block and a 32-block int8-activation type (or two of the same kind, which
    share the quantization) give the CPU's bits: the quantization cache is keyed by the activation kind."""
    rng = fresh_rng()
    rows, cols, T = int(rng.integers(1, 70)), 512, int(rng.integers(1, 17))
    gt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}
    ws = [weights(rng, typ, rows, cols) for typ in pair]
    words = [np.concatenate([w, np.zeros((-w.size) % 4, np.uint8)]).view(np.int32) for w in ws]
    x = rng.standard_normal((T, cols)).astype(np.float32)
    both("matmul_pair", [x, nan(T, rows), nan(T, rows)], i=words, n=[gt[pair[0]], gt[pair[1]], rows, cols, T])


def test_dn_untile_retile_equal_cpu():
    rng = fresh_rng()
    T, nk, r, dk, dv = int(rng.integers(1, 9)), 2, 3, 16, 8
    nv = nk * r
    cd, d_inner = 2 * nk * dk + nv * dv, nv * dv
    fh = rng.permutation(nv).astype(np.int32)
    f = [rng.standard_normal((T, cd)), nan(T, cd), rng.standard_normal((T, d_inner)), nan(T, d_inner),
         rng.standard_normal((T, nv)), rng.standard_normal((T, nv)), nan(T, 2 * nv)]
    out = both("dn_untile", f, i=[fh], n=[cd, nk * dk, T, nk, nv, dv])
    assert not np.isnan(out[1]).any() and not np.isnan(out[6]).any()
    back = both("dn_retile", [out[3], nan(T, d_inner)], i=[fh], n=[T, nv, dv])[1]
    np.testing.assert_array_equal(bits(back), bits(f[2].astype(np.float32).ravel()))  # z untiled, retiled = z


@pytest.mark.parametrize("typ", CUDA_TYPES + ["Q4_K-generic", "Q6_K-generic", "Q5_K-lanes"])
def test_matmul_sel_equals_cpu_and_one_row_products(typ):
    """Expert products over a device selection equal the CPU backend's and each slot's one-row product ("-generic": the
    type on the generic int8 kernel k_int, cuda_prefer_kq_lanes(False), not the default dp4a lane kernel, slots and
    one-row products both; "Q5_K-lanes": Q5_K on the lane kernel, cuda_prefer_q5k_lanes(True))."""
    if typ.endswith("-generic"):
        with switched(_core.cuda_prefer_kq_lanes, False, True):
            return test_matmul_sel_equals_cpu_and_one_row_products(typ.split("-")[0])
    if typ.endswith("-lanes"):
        with switched(_core.cuda_prefer_q5k_lanes, True, False):
            return test_matmul_sel_equals_cpu_and_one_row_products(typ.split("-")[0])
    rng = fresh_rng()
    E, rows, cols, k = 5, int(rng.integers(1, 40)), 512, 3
    T = int(rng.integers(1, 6))
    w = np.concatenate([weights(rng, typ, rows, cols) for _ in range(E)])
    eb = w.size // E
    pad = (-w.size) % 4
    words = np.concatenate([w, np.zeros(pad, np.uint8)]).view(np.int32)
    sel = rng.integers(0, E, T * k).astype(np.int32)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    qt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}[typ]
    y = both("matmul_sel", [x, nan(T * k, rows)], i=[sel, words], n=[qt, rows, cols, T * k, k, cols, rows, eb])[1]
    y = y.reshape(T * k, rows)
    for s in range(T * k):
        want = _core.backend_matmul("cuda", w[sel[s] * eb:(sel[s] + 1) * eb].copy(), typ, rows, cols, x[s // k:s // k + 1])
        assert np.array_equal(bits(want[0]), bits(y[s])), f"slot {s}"


@pytest.mark.parametrize("typ", ["IQ2_XXS", "Q4_K", "Q8_0", "Q4_K-pair", "Q5_K-pair", "Q6_K-pair"])
def test_matmul_sel_swiglu_equals_cpu_and_its_parts(typ):
    """The experts' gate, up and SwiGLU over one selection (one kernel on the GPU for IQ2_XXS, the three operations
    for the other types; "-pair": Q4_K / Q5_K / Q6_K's dp4a lane kernel taking gate and up in one launch,
    cuda_prefer_kq_pair(True), Q5_K's with cuda_prefer_q5k_lanes(True)) equal the CPU backend's, and the GPU's own
    matmul_sel + matmul_sel + silu_mul."""
    if typ.endswith("-pair"):
        with switched(_core.cuda_prefer_kq_pair, True, False), switched(_core.cuda_prefer_q5k_lanes, True, False):
            return test_matmul_sel_swiglu_equals_cpu_and_its_parts(typ.split("-")[0])
    rng = fresh_rng()
    E, rows, k = 6, int(rng.integers(1, 40)), 4
    cols = 256 * int(rng.integers(1, 4))
    T = int(rng.integers(1, 6))
    S = T * k
    gw = np.concatenate([weights(rng, typ, rows, cols) for _ in range(E)])
    uw = np.concatenate([weights(rng, typ, rows, cols) for _ in range(E)])
    eb = gw.size // E
    words = [np.concatenate([w, np.zeros((-w.size) % 4, np.uint8)]).view(np.int32) for w in (gw, uw)]
    sel = rng.integers(0, E, S).astype(np.int32)
    x = (rng.standard_normal((T, cols)) * 2).astype(np.float32)
    qt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}[typ]
    g, u = both("matmul_sel_swiglu", [x, nan(S, rows), nan(S, rows)], i=[sel, *words],
                n=[qt, rows, cols, S, k, cols, eb])[1:]
    assert np.isfinite(g).all() and np.isfinite(u).all()
    pg = _op("cuda", "matmul_sel", [x, nan(S, rows)], i=[sel, words[0]], n=[qt, rows, cols, S, k, cols, rows, eb])[0][1]
    pu = _op("cuda", "matmul_sel", [x, nan(S, rows)], i=[sel, words[1]], n=[qt, rows, cols, S, k, cols, rows, eb])[0][1]
    assert np.array_equal(bits(pu), bits(u))
    want = _op("cuda", "silu_mul", [pg, pu], n=[S * rows])[0][0]
    assert np.array_equal(bits(want), bits(g))


@pytest.mark.parametrize("rows_a_warp", [(1, 1, 1), (2, 2, 2), (4, 4, 4), (2, 1, 4)])
def test_iq2_rows_a_warp_give_the_same_bits(rows_a_warp):
    """The IQ2_XXS one-row kernel with 1, 2 or 4 weight rows a warp (cuda_prefer_iq2_rows; the tables loaded once a
    block, 2 or 4 blocks a step): dense products of 1..3 rows, expert products and the fused gate / up / SwiGLU equal
    the CPU backend's bit for bit, for 1..3 and 8+ blocks a row and row counts that leave warps partly empty."""
    rng = fresh_rng()
    qt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}["IQ2_XXS"]
    with iq2_rows(*rows_a_warp):
        with pytest.raises(ValueError, match="1, 2 or 4"):
            _core.cuda_prefer_iq2_rows(3, 1, 1)
        for cols in (256, 512, 768, 2048):
            rows = int(rng.integers(1, 80))
            T = int(rng.integers(1, 4))
            w = weights(rng, "IQ2_XXS", rows, cols)
            x = rng.standard_normal((T, cols)).astype(np.float32)
            want = _core.backend_matmul("cpu", w, "IQ2_XXS", rows, cols, x)
            got = _core.backend_matmul("cuda", w, "IQ2_XXS", rows, cols, x)
            assert np.array_equal(bits(want), bits(got)), f"dense {rows} x {cols}, T = {T}"
            E, k = 5, 3
            ws = [np.concatenate([weights(rng, "IQ2_XXS", rows, cols) for _ in range(E)]) for _ in range(2)]
            eb = ws[0].size // E
            words = [np.concatenate([v, np.zeros((-v.size) % 4, np.uint8)]).view(np.int32) for v in ws]
            sel = rng.integers(0, E, T * k).astype(np.int32)
            both("matmul_sel", [x, nan(T * k, rows)], i=[sel, words[0]], n=[qt, rows, cols, T * k, k, cols, rows, eb])
            both("matmul_sel_swiglu", [x, nan(T * k, rows), nan(T * k, rows)], i=[sel, *words],
                 n=[qt, rows, cols, T * k, k, cols, eb])


@pytest.mark.parametrize("u4", [False, True])
def test_iq2_dense_windows_give_the_same_bits(u4):
    """Dense IQ2_XXS windows of 2..4 rows over matrices large enough for the window kernel (k_iq2xxs_warp: 4224+
    weight rows; fewer take the one-row kernel a row at a time), 2 or 4 blocks of a weight row a step
    (cuda_prefer_iq2_window_u4): the CPU backend's bits, for rows of 1, 2 (4 weight rows a warp), 3, 4, 8 and 9
    blocks, and weight row counts that leave the last block's warps partly empty."""
    rng = fresh_rng()
    with switched(_core.cuda_prefer_iq2_window_u4, u4, False):
        for cols in (256, 512, 768, 1024, 2048, 2304):
            rows = 4224 + int(rng.integers(1, 40))
            w = weights(rng, "IQ2_XXS", rows, cols)
            for T in (2, 3, 4):
                x = rng.standard_normal((T, cols)).astype(np.float32)
                want = _core.backend_matmul("cpu", w, "IQ2_XXS", rows, cols, x)
                got = _core.backend_matmul("cuda", w, "IQ2_XXS", rows, cols, x)
                assert np.array_equal(bits(want), bits(got)), f"dense {rows} x {cols}, T = {T}, u4 = {u4}"


@pytest.mark.parametrize("typ", ["IQ2_XXS", "IQ2_XXS-dp4a", "IQ2_XXS-l2", "Q4_K", "Q4_K-dp4a", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("shape", ["few", "tiles-long-runs", "tiles-many-experts", "tiles-prompt-piece",
                                   "tiles-pieces"])
def test_moe_experts_union_equals_cpu_and_slots(typ, shape):
    """The IQ2_XXS and K-quant tiles on the tensor cores (mma.cuh k_tiles_mma, the default: each tile's activation
    rows staged in shared memory first; gate and up in one kernel), with those rows read from L2 ("-l2":
    cuda_prefer_tile_stage(False)) and on the dp4a kernels ("-dp4a")."""
    typ, _, how = typ.partition("-")
    with tensor_cores(how != "dp4a"), switched(_core.cuda_prefer_tile_stage, how != "l2", True):
        _moe_experts_case(typ, shape)


def _moe_experts_case(typ, shape):
    """A window's routed experts (gate / up / SwiGLU in one kernel for IQ2_XXS, then down over the same selection)
    equal the CPU backend's bit for bit, and each token row's slots equal that row alone (T = 1). "few": few
    experts, so that rows share them (up to 7 slots of one expert). The "tiles" shapes are prompt pieces: from 64
    slots on the GPU groups a selection by expert into tiles of up to 16 slots (matmul.cu k_sel_tiles, a sort of up
    to 8192 slots): runs longer than a tile, hundreds of one-slot tiles, a 512-row prompt piece of top-10 routing
    over 512 experts (5120 slots, ~10 an expert: the 80B file's prefill), and over 8192 slots (two pieces)."""
    rng = fresh_rng()
    if shape == "few":
        E, k, T = int(rng.integers(2, 6)), 2, int(rng.integers(2, 8))
    else:
        E, k, T = {"tiles-long-runs": (3, 3, 64), "tiles-many-experts": (200, 10, 64),
                   "tiles-prompt-piece": (512, 10, 512), "tiles-pieces": (24, 10, 830)}[shape]
    F, H = (256, 256) if T > 64 else (256, 512)
    S = T * k
    mats = [np.concatenate([weights(rng, typ, r, c) for _ in range(E)]) for r, c in ((F, H), (F, H), (H, F))]
    words = [np.concatenate([w, np.zeros((-w.size) % 4, np.uint8)]).view(np.int32) for w in mats]
    sel = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32).ravel()
    x = (rng.standard_normal((T, H)) * 2).astype(np.float32)
    qt = {t.name: int(t) for t in __import__("gguf").GGMLQuantizationType}[typ]
    n = [qt, F, H, S, k, mats[0].size // E, mats[2].size // E]
    got = both("moe_experts", [x, nan(S, F), nan(S, F), nan(S, H)], i=[sel, *words], n=n)
    assert all(np.isfinite(a).all() for a in got[1:])
    # every row against the CPU above; here rows alone (a block per slot on the GPU) for a few rows of each piece
    rows = range(T) if T <= 8 else sorted({0, T - 1, *rng.choice(T, 6, replace=False).tolist()})
    for t in rows:
        one = _op("cuda", "moe_experts", [x[t], nan(k, F), nan(k, F), nan(k, H)], i=[sel[t * k:(t + 1) * k], *words],
                  n=[qt, F, H, k, k, *n[5:]])[0]
        for j in (1, 2, 3):
            assert np.array_equal(bits(one[j]), bits(got[j].reshape(S, -1)[t * k:(t + 1) * k].ravel())), (t, j)


# ---------------------------------------------------------------- the GPU session
@pytest.fixture(scope="module", autouse=True)
def cpu_scalar():
    """The CPU session on its scalar kernels (the GPU's attention is attend_ref's order), restored afterwards."""
    prev = _core.active_isa()
    _core.force_isa("scalar")
    yield
    _core.force_isa(prev)


@pytest.fixture(scope="module")
def default_model():
    return Model.load(threads=4)


@pytest.fixture(scope="module")
def q35(tmp_path_factory):
    return tiny_qwen35moe(tmp_path_factory.mktemp("q35g"), seed=24, threads=4)


@pytest.fixture(scope="module")
def q4k_model(tmp_path_factory):
    from strata_py import synth
    return Model.load(synth.write("tiny", tmp_path_factory.mktemp("q4k") / "tiny-q4_k.gguf", "q4_k", seed=5), threads=4)


@pytest.fixture(scope="module")
def iq2_model(tmp_path_factory):
    """Every matrix IQ2_XXS (the 80B file's type): the warp-per-row product and the fused expert gate / up."""
    from strata_py import synth
    return Model.load(synth.write("tiny", tmp_path_factory.mktemp("iq2") / "tiny-iq2_xxs.gguf", "iq2_xxs", seed=6),
                      threads=4)


@pytest.mark.parametrize("which", ["tiny_model", "tiny_q8_model", "default_model", "q35", "q4k_model", "iq2_model"])
def test_gpu_session_windows(request, which):
    m = request.getfixturevalue(which)
    for _ in range(2):
        windows_equal(m, "cuda", fresh_rng(), n_windows=16, label=which)


def test_gpu_kq_pair_windows_equal_cpu(q4k_model):
    """The experts' Q4_K gate / up / SwiGLU of decode steps and verify windows as one dp4a lane kernel launch
    (cuda_prefer_kq_pair(True); recorded steps included): the CPU session's logits and hidden rows bit for bit. A model
    loaded inside the switch: its backend copy records its steps with the pair (another's parked session would bring
    recordings made without it)."""
    with switched(_core.cuda_prefer_kq_pair, True, False):
        m = Model.load(q4k_model.path, threads=4)
        windows_equal(m, "cuda", fresh_rng(), n_windows=16, label="q4k, gate / up pair")


def test_gpu_q5k_lanes_windows_equal_cpu(tmp_path):
    """A Q5_K model (every matrix) with Q5_K's one-row products on the dp4a lane kernel and the experts' gate / up pair
    (cuda_prefer_q5k_lanes, cuda_prefer_kq_pair): prompt, decode steps and verify windows give the CPU session's
    logits and hidden rows bit for bit."""
    from strata_py import synth
    path = synth.write("tiny", tmp_path / "tiny-q5_k.gguf", "q5_k", seed=7)
    with switched(_core.cuda_prefer_q5k_lanes, True, False), switched(_core.cuda_prefer_kq_pair, True, False):
        windows_equal(Model.load(path, threads=4), "cuda", fresh_rng(), n_windows=16, label="q5k, lanes + pair")


def test_gpu_recorded_steps_equal_cpu(tiny_q8_model, default_model, iq2_model):
    """Decode steps and verify windows replayed from their recordings (CUDA graphs) give the CPU session's logits
    bit for bit: T = 1 steps across the 256-cell span of the attention launches, repeated verify windows with full
    keeps (S_work copied into S on the card: one recording) and partial keeps. With programmatic dependent launch (sm_90+:
    each kernel's blocks scheduled while the one before still runs, launch.cuh; the default, with the dense
    products' weight prefetch, and plain launches for the windows of 8), with it for every step, and without it: the
    same bits (the CPU's) every way."""
    for m in (tiny_q8_model, default_model, iq2_model):
        rng = fresh_rng()
        plan = [("prompt", rng.integers(0, m.n_vocab, 240).tolist(), 240)]
        plan += [(f"step {i}", rng.integers(0, m.n_vocab, 1).tolist(), 1) for i in range(24)]  # positions 240..263:
        plan += [(f"window {w}", rng.integers(0, m.n_vocab, 4).tolist(),  # the span changes at 256
                  4 if w % 3 else int(rng.integers(1, 4))) for w in range(10)]
        plan += [(f"window {w} of 8", rng.integers(0, m.n_vocab, 8).tolist(),  # plain launches by default
                  8 if w % 2 else int(rng.integers(1, 8))) for w in range(4)]
        ref = m.session(n_ctx=400, max_window=8, backend="cpu")
        want = []
        for _, toks, keep in plan:  # the CPU session once, every launch mode against it
            want.append(ref.run(toks))
            ref.commit(keep)
        for mode in ("on", "all", "off"):
            with pdl(mode):
                before = _core.recorded_step_replays()
                got = m.session(n_ctx=400, max_window=8, backend="cuda")
                for (label, toks, keep), w in zip(plan, want):
                    assert_same(w, got.run(toks), f"{label}, launches {mode}")
                    got.commit(keep)
                assert _core.recorded_step_replays() - before >= 16  # the recorded path ran (most steps)
                assert _core.cuda_pdl_used() == (mode != "off" and pdl_card())


def pdl_card() -> bool:
    """Whether the device is sm_90 or later (programmatic dependent launch), read off cuda_info()."""
    import re
    m = re.search(r"sm_(\d+)", _core.cuda_info())
    return bool(m) and int(m.group(1)) >= 90


def test_gpu_session_long_prompt(tiny_q8_model):
    windows_equal(tiny_q8_model, "cuda", fresh_rng(), n_windows=4, prompt=150, n_ctx=320, label="150-row prompt")


@pytest.mark.parametrize("which", ["tiny_q8_model", "q4k_model", "iq2_model"])
def test_gpu_prompt_pieces_of_any_rows_equal_cpu(request, which):
    """A prompt of 1100 rows on the card in pieces of 512 rows (the default: each product over the piece's rows in one
    launch, the expert products grouped over 5000+ slots), of 64 and of 100: the CPU session's logits and hidden rows
    bit for bit each way, and windows after it."""
    m = request.getfixturevalue(which)
    for rows in (512, 64, 100):
        with prompt_rows(rows):
            windows_equal(m, "cuda", fresh_rng(), n_windows=3, prompt=1100, n_ctx=1200,
                          label=f"{which}, 1100-row prompt in pieces of {rows}")


@pytest.mark.parametrize("which", ["tiny_q8_model", "q4k_model"])
def test_gpu_attention_tiles_everywhere_equal_cpu(request, which):
    """The tiled attention kernels of prompt pieces taken from one query up (every T = 1 step, window and prompt,
    recorded steps with the cells counted on the card): the CPU session's logits bit for bit."""
    m = request.getfixturevalue(which)
    _core.cuda_prefer_attn_tiles(True, 1)
    try:
        windows_equal(m, "cuda", fresh_rng(), n_windows=4, prompt=150, n_ctx=320, label=f"{which}, tiles from 1 query")
    finally:
        _core.cuda_prefer_attn_tiles(True, 1024)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("draft", ["none", "suffix"])
def test_gpu_decode(default_model, temperature, draft):
    decode_equal(default_model, "cuda", fresh_rng(), temperature=temperature, draft=draft, max_tokens=32,
                 label=f"{draft} t={temperature}")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_gpu_speculative_equals_plain(default_model, temperature):
    seed = int(fresh_rng().integers(1 << 62))
    plain = decode_equal(default_model, "cuda", np.random.default_rng(seed), temperature=temperature, draft="none")
    drafted = decode_equal(default_model, "cuda", np.random.default_rng(seed), temperature=temperature, draft="suffix")
    assert plain == drafted


@pytest.mark.parametrize("which", ["tiny_q8_model", "q35"])
def test_gpu_checkpoints_move_to_and_from_the_cpu(request, which, tmp_path):
    """A checkpoint of a GPU session (the card's KV cells, DeltaNet S and conv history, downloaded) restores on the
    CPU, in memory and through a file, and a CPU session's restores on the GPU: continuing gives the CPU
    session's logits bit for bit either way."""
    m = request.getfixturevalue(which)
    rng, V = fresh_rng(), m.n_vocab
    cpu = m.session(n_ctx=160, max_window=8, backend="cpu")
    prompt = rng.integers(0, V, int(rng.integers(10, 40))).tolist()
    cpu.run(prompt)
    cpu.commit(len(prompt))
    gpu = m.session(n_ctx=160, max_window=8, backend="cuda")
    gpu.restore(cpu.checkpoint())
    continue_equal(cpu, gpu, rng, V, 6, f"{which} cpu -> gpu")
    gpu.save(tmp_path / "g.ckpt")
    back = m.session(n_ctx=160, max_window=8, backend="cpu")
    back.load(tmp_path / "g.ckpt")
    continue_equal(cpu, back, rng, V, 4, f"{which} gpu -> cpu (file)")
    with pytest.raises(RuntimeError, match="export_state\\(\\): not supported on backend='cuda'"):
        gpu._core.export_state()
