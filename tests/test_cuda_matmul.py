"""CUDA T-row products and norms (csrc/kernels/cuda/) on the device, against the CPU: every type's product equals the
CPU's scalar `_ref` twin bit for bit (the kernels compute matmul.h's lane order with the same float32 operations;
int8-activation types quantize the rows on the card exactly as quantize_act_ref / quantize_act32_ref), so the tolerance is zero; a T-row
call equals T one-row calls bit for bit, for T across the 16-row pass boundary; rmsnorm equals ops.h's. Fresh random
inputs on every run, outputs compared as bit patterns. Skipped where no CUDA device is usable (CI)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_util import CUDA_TYPES, NOT_ON_CUDA, bits, needs_cuda, switched, tensor_cores, weights
from kquant import ACT32_TYPES
from strata_py import _core

pytestmark = needs_cuda

FLOAT = {"F32", "F16", "BF16"}


def _shape(rng, typ):
    """Rows not a multiple of the 16 rows of a thread block; float types also with a column tail (cols % 16 != 0);
    the 32-block int8-activation types also with an odd number of blocks (96 columns)."""
    rows = int(rng.integers(1, 70))
    cols = int(rng.choice([16 * 37 + 5, 2048])) if typ in FLOAT else int(rng.choice([256, 768, 2048]))
    if typ in ACT32_TYPES and rng.integers(0, 2):
        cols = 96
    return rows, cols


@pytest.mark.parametrize("typ", CUDA_TYPES)
def test_product_equals_cpu_ref(typ):
    rng = np.random.default_rng()
    for _ in range(3):
        rows, cols = _shape(rng, typ)
        w = weights(rng, typ, rows, cols)
        T = int(rng.integers(1, 20))
        x = (rng.standard_normal((T, cols)) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, : min(256, cols)] = 0.0  # an all-zero block (dx = 0)
        got = _core.backend_matmul("cuda", w, typ, rows, cols, x)
        want = _core.matmul(w, typ, rows, cols, x, isa="scalar")
        assert got.shape == (T, rows)
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{typ} {rows}x{cols} T={T}")


@pytest.mark.parametrize("typ", ["F16", "Q8_0", "Q4_1", "Q4_K", "Q6_K", "IQ2_XXS", "IQ3_XXS"])
@pytest.mark.parametrize("split", [True, False])
def test_t_rows_equal_one_row(typ, split):
    """split: float matrices this small (1.2 MB) take windows of 2..8 rows as the 1-row kernel per activation row
    (the default; longer windows the T-row kernels), and the 32-value block types' (Q4_1 here: int8 activations)
    windows the 1-row kernel per activation row; without it, every window the T-row kernels k_float<D, 2 / 4 / 8 /
    16> and k_b32q<D, 2 / 4 / 8 / 16> that larger matrices take."""
    rng = np.random.default_rng()
    rows, cols = 300, 2048
    w = weights(rng, typ, rows, cols)
    x = rng.standard_normal((40, cols)).astype(np.float32)
    one = np.stack([_core.backend_matmul("cuda", w, typ, rows, cols, x[t:t + 1])[0] for t in range(40)])
    with switched(_core.cuda_prefer_float_split, 8 << 20 if split else 0, 8 << 20), \
            switched(_core.cuda_prefer_b32q_split, split, True):
        for T in (2, 3, 4, 5, 8, 9, 16, 17, 18, 33, 40):  # past 16: blocks of 16 rows in y; IQ2_XXS from 32: the panel
            got = _core.backend_matmul("cuda", w, typ, rows, cols, x[:T])
            np.testing.assert_array_equal(bits(got), bits(one[:T]), err_msg=f"{typ} T={T}")


@pytest.mark.parametrize("typ", ["F32", "BF16", "Q8_0", "Q4_K", "IQ2_XXS", "IQ3_XXS"])
def test_large_matrices_equal_cpu_ref(typ):
    """The launch shapes of large matrices (csrc/kernels/cuda/matmul.cu): >= 67584 rows run float types 4 rows a
    thread, > 65536 rows run int8-activation types' 4096 thread blocks over several 16-row groups each."""
    rng = np.random.default_rng()
    rows, cols = 70001, (83 if typ in FLOAT else 256)
    w = weights(rng, typ, rows, cols)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    np.testing.assert_array_equal(bits(_core.backend_matmul("cuda", w, typ, rows, cols, x)),
                                  bits(_core.matmul(w, typ, rows, cols, x, isa="scalar")))


@pytest.mark.parametrize("n", [2048, 300, 7])
def test_rmsnorm_equals_cpu(n):
    rng = np.random.default_rng()
    x = (rng.standard_normal((5, n)) * rng.uniform(0.01, 100)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(bits(_core.backend_rmsnorm("cuda", x, w, 1e-6)),
                                  bits(_core.backend_rmsnorm("cpu", x, w, 1e-6)))


@pytest.mark.parametrize("typ", NOT_ON_CUDA)
def test_types_without_a_kernel_refuse(typ):
    rng = np.random.default_rng()
    w = weights(rng, typ, 4, 256)
    with pytest.raises(ValueError, match=f"no CUDA kernel for weight type {typ}"):
        _core.backend_matmul("cuda", w, typ, 4, 256, np.ones((1, 256), np.float32))


def test_device_name_and_launch_timing():
    """The device is named, and the launch timer bench_cuda.py reports from gives a (median, min) pair. How fast
    a launch is belongs to the bench (gpu-h200.json's launch_us), not to this test."""
    assert "cuda:0" in _core.backend_name("cuda")
    median, least = _core.cuda_bench_launch(reps=3)
    assert 0 < least <= median and np.isfinite(median)


def _largest_lane_sums(rng, w, rows, cols, T):
    """IQ2_XXS weights w with every sub-block scale at 15 and no negative sign, and T activation rows of +-1 (q =
    +-127), the first 6 all positive: the lane sums P at their largest, where the (float)P bias needs |P| < 2^22."""
    blocks = w.reshape(rows, cols // 256, 66).copy()
    for sb in range(8):  # sub-block sb's sign / scale word at 2 + 8 sb + 4: 0xf0000000
        blocks[:, :, 6 + 8 * sb:9 + 8 * sb] = 0
        blocks[:, :, 9 + 8 * sb] = 0xF0
    x = np.sign(rng.standard_normal((T, cols))).astype(np.float32)
    x[:6] = 1.0
    return blocks.ravel(), x


def _iq2xxs_both_ways(rng, rows, cols, T, largest, other):
    """A random IQ2_XXS product (largest: at the largest lane sums) on the default kernels and inside other() (a
    context on another kernel): the CPU's scalar kernel's bits both ways."""
    w = weights(rng, "IQ2_XXS", rows, cols)
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.01, 100)).astype(np.float32)
    if largest:
        w, x = _largest_lane_sums(rng, w, rows, cols, T)
    want = _core.matmul(w, "IQ2_XXS", rows, cols, x, isa="scalar")
    got = _core.backend_matmul("cuda", w, "IQ2_XXS", rows, cols, x)
    with other():
        alt = _core.backend_matmul("cuda", w, "IQ2_XXS", rows, cols, x)
    msg = f"{rows}x{cols} T={T}"
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=msg)
    np.testing.assert_array_equal(bits(alt), bits(want), err_msg=msg + " (the other kernel)")


def test_iq2xxs_tensor_cores_equal_dp4a_and_cpu_ref():
    """IQ2_XXS products of 5+ rows take the int8 tensor cores (csrc/kernels/cuda/iq2_mma.cuh: P_k = 256 P_hi + P_lo by two
    MMAs, exact); they equal the dp4a kernels and the CPU's scalar kernel bit for bit: rows across the 16-row tiles,
    T within a pass (5..16) and over several (64, 70), and blocks at the largest lane sums (every sub-block scale 15, all
    signs +, activations at +-127) where the (float)P bias needs |P| < 2^22."""
    rng = np.random.default_rng()
    assert _core.cuda_mma_used(), "the H200 has int8 tensor cores: the products must take them"
    cases = [(int(rng.integers(1, 70)), 2048, T) for T in (5, 8, 9, 16, 64, 70)] + [(37, 512, 13)]
    for rows, cols, T in cases + [(40, 1024, 12)]:  # the last: the largest |P|
        _iq2xxs_both_ways(rng, rows, cols, T, (rows, cols, T) == (40, 1024, 12), lambda: tensor_cores(False))


def test_iq2xxs_tensor_cores_from_two_rows():
    """The tensor-core kernel over 2..4 rows (min_rows = 2; the default takes it from 5): still the CPU's bits."""
    rng = np.random.default_rng()
    with tensor_cores(True, 2):
        for T in (2, 3, 4):
            rows = int(rng.integers(1, 70))
            w = weights(rng, "IQ2_XXS", rows, 2048)
            x = rng.standard_normal((T, 2048)).astype(np.float32)
            np.testing.assert_array_equal(bits(_core.backend_matmul("cuda", w, "IQ2_XXS", rows, 2048, x)),
                                          bits(_core.matmul(w, "IQ2_XXS", rows, 2048, x, isa="scalar")),
                                          err_msg=f"{rows} rows T={T}")
    with pytest.raises(ValueError, match="min_rows"):
        _core.cuda_prefer_mma(True, 1)


@pytest.mark.parametrize("staged", [True, False])
def test_iq2xxs_panel_equals_tensor_cores_and_cpu_ref(staged):
    """Dense IQ2_XXS products of 32+ rows (prompt pieces) decode a block's 16 weight rows once into shared memory
    (iq2_mma.cuh k_iq2xxs_panel; staged, the default: k_iq2xxs_panel_staged, each warp's 16 activation rows copied
    into shared memory by cp.async and read by ldmatrix): the CPU's scalar kernel and k_iq2xxs_mma bit for bit, for
    rows across the 16-row blocks, the activation rows split in y (few weight rows) or not, tiles of 8 / 16 cut by T
    (T = 33, 37, 45: a partial last tile; 40: a partial 16-row tile of whole 8-row halves), 1..16 blocks a row (the
    80B file's 2048 and 4096 columns), past the panel's shared memory (5120 columns: k_iq2xxs_mma), and the largest
    lane sums (every sub-block scale 15, all signs +, activations +-127)."""
    rng = np.random.default_rng()
    cases = [(int(rng.integers(1, 40)), 2048, 32), (300, 256, 100), (2100, 2048, 37), (17, 4096, 513),
             (33, 5120, 45), (40, 1024, 40), (2048, 4096, 200)]
    with switched(_core.cuda_prefer_iq2_panel_staged, staged, True):
        for rows, cols, T in cases:  # (40, 1024, 40): the largest |P|
            _iq2xxs_both_ways(rng, rows, cols, T, (rows, cols, T) == (40, 1024, 40),
                              lambda: switched(_core.cuda_prefer_iq2_panel, False, True))


@pytest.mark.parametrize("typ", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("lanes", [True, False])
def test_kquant_one_row_products_equal_cpu_ref(typ, lanes):
    """Q4_K's, Q5_K's and Q6_K's one-row products on the dp4a lane kernel (k_kq_lanes, the default; Q5_K with
    cuda_prefer_q5k_lanes(True)) and on k_int (cuda_prefer_kq_lanes(False)): the CPU's scalar kernel's bits for 1 and 2
    blocks a row (2 a step), 3 (a partial step of 4) and 8; small matrices (64-thread blocks; a window of them is the
    1-row kernel per activation row), 256-thread blocks and 70001 rows (grid-stride over the row groups); codes and
    scales (Q4_K / Q5_K: and mins; Q5_K: the high bits) at their extremes in some blocks."""
    rng = np.random.default_rng()
    nbytes = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[typ]
    for rows, cols, T in ((37, 256, 1), (300, 512, 1), (1000, 768, 1), (4100, 2048, 1), (70001, 256, 1), (50, 768, 3)):
        w = weights(rng, typ, rows, cols).reshape(-1, nbytes)
        if typ in ("Q4_K", "Q5_K"):
            w[::7, 4:16] = 0xFF  # every 6-bit scale and min at 63
            w[::5, 16:] = 0xFF   # every code at 15 (Q5_K: 31, every high bit set)
            if typ == "Q5_K":
                w[::3, 16:48] = 0  # no high bit
        else:
            w[::5, :192] = 0xFF  # every code at 63
            w[::7, :192] = 0     # every code at 0 (q - 32 = -32)
            w[::3, 192:208] = np.array([0x80, 0x7F] * 8, np.uint8)  # scales -128 and 127
        w = w.ravel()
        x = (rng.standard_normal((T, cols)) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :256] = 0.0  # an all-zero block (dx = 0)
        want = _core.matmul(w, typ, rows, cols, x, isa="scalar")
        with switched(_core.cuda_prefer_kq_lanes, lanes, True), switched(_core.cuda_prefer_q5k_lanes, True, False):
            got = _core.backend_matmul("cuda", w, typ, rows, cols, x)
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{typ} {rows}x{cols} T={T} lanes={lanes}")


@pytest.mark.parametrize("typ", ["Q4_K", "Q5_K", "Q6_K"])
def test_kquant_tensor_cores_equal_cpu_ref(typ):
    """Q4_K / Q5_K / Q6_K products over prompt pieces (17+ rows) take the int8 tensor cores (kq_mma.cuh's sources over
    mma.cuh's k_mma: w's two bytes by two MMAs, Q4_K's mins by m16n8k32 MMAs): the CPU's scalar kernel's bits for
    weight rows across the 16-row groups, T = 17..513 (partial 8- and 16-row groups), 1..16 blocks a row, and blocks at
    the largest sums against activations at +127: Q4_K / Q5_K every scale, min and code at its top (|P| up to
    16 * 1953 * 127, |M| = 256 * 63 * 127: the bias conversions), Q6_K every scale -128 and code 0 (|P| = 16 * 4096 * 127 > 2^22: the
    int to float conversion)."""
    assert _core.cuda_mma_used(), "the card has int8 tensor cores: the products must take them"
    rng = np.random.default_rng()
    nbytes = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[typ]
    for rows, cols, T in ((int(rng.integers(1, 40)), 2048, 17), (300, 256, 100), (37, 4096, 33), (2100, 512, 40),
                          (17, 1024, 513)):
        w = weights(rng, typ, rows, cols).reshape(-1, nbytes)
        top = np.arange(len(w)) // (cols // 256) % 4 == 0  # every block of every 4th row
        if typ != "Q6_K":
            w[top, 4:] = 0xFF      # scales and mins 63, codes 15 (Q5_K: 31)
        else:
            w[top, :192] = 0       # codes 0: q - 32 = -32
            w[top, 192:208] = 0x80  # scales -128
        w = w.ravel()
        x = (rng.standard_normal((T, cols)) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :256] = 0.0   # an all-zero block (dx = 0)
        x[1] = 3.0         # every value at +127
        want = _core.matmul(w, typ, rows, cols, x, isa="scalar")
        got = _core.backend_matmul("cuda", w, typ, rows, cols, x)
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{typ} {rows}x{cols} T={T}")


@pytest.mark.parametrize("typ", ["Q4_K", "Q5_K", "Q6_K"])
def test_kquant_windows_equal_one_row(typ):
    """Small K-quant matrices over prompt pieces on the 16-row kernel (the default without the tensor cores: cards
    before sm_80, cuda_prefer_mma(False)) give each row's one-row product bit for bit, as a block per activation row
    does (cuda_prefer_kquant_windows(False)): 17..40 rows, 300 and 64 weight rows."""
    rng = np.random.default_rng()
    for rows in (300, 64):
        w = weights(rng, typ, rows, 2048)
        x = rng.standard_normal((40, 2048)).astype(np.float32)
        one = np.stack([_core.backend_matmul("cuda", w, typ, rows, 2048, x[t:t + 1])[0] for t in range(40)])
        for on in (True, False):
            with tensor_cores(False), switched(_core.cuda_prefer_kquant_windows, on, True):
                for T in (17, 32, 40):
                    got = _core.backend_matmul("cuda", w, typ, rows, 2048, x[:T])
                    np.testing.assert_array_equal(bits(got), bits(one[:T]), err_msg=f"{typ} {rows} rows T={T} on={on}")


@pytest.mark.parametrize("typ", ["F32", "Q8_0"])
def test_float_tiles_from_fewer_rows_equal_cpu_ref(typ):
    """k_float_tiles from 16 activation rows (cuda_prefer_float_tiles(True, 16, 0): launch mode "floattiles16", a
    16-row verify window's head and routers; with min_weight_rows 4096, the default: the head alone) and from 2: the CPU's
    scalar kernel's bits for windows of 2..31 rows (a 32-row tile mostly empty), as k_float's; min_rows under 2 and a
    negative min_weight_rows are refused by name."""
    rng = np.random.default_rng()
    for rows, cols, T in ((8192, 256, 16), (512, 2048, 16), (37, 1000, 17), (70, 64, 31), (33, 2048, 2)):
        cols = cols if typ == "F32" else cols // 32 * 32  # Q8_0: whole 32-value blocks
        w = weights(rng, typ, rows, cols)
        x = rng.standard_normal((T, cols)).astype(np.float32)
        want = _core.matmul(w, typ, rows, cols, x, isa="scalar")
        for min_w in (0, 4096):
            with switched(lambda m: _core.cuda_prefer_float_tiles(True, *m), (2 if T < 16 else 16, min_w), (16, 4096)):
                got = _core.backend_matmul("cuda", w, typ, rows, cols, x)
            np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{typ} {rows}x{cols} T={T} min_w={min_w}")
    with pytest.raises(ValueError, match="min_rows"):
        _core.cuda_prefer_float_tiles(True, 1)
    with pytest.raises(ValueError, match="min_weight_rows"):
        _core.cuda_prefer_float_tiles(True, 16, -1)


@pytest.mark.parametrize("typ", ["F32", "F16", "BF16"])
def test_router_row_groups_equal_rows_and_cpu_ref(typ):
    """Small float matrices (the F32 routers: 512 x 2048) over a prompt piece's rows: blocks of 32 rows x 32 weight
    rows staged in shared memory (k_float_tiles, the default from 32 rows), a block per row (tiles off) and blocks of
    16 activation rows (cuda_prefer_row_groups(True)) give the CPU's scalar kernel's bits; weight rows and columns
    that cut the 32-row and 64-column tiles (and columns padded to 16)."""
    rng = np.random.default_rng()
    for rows, cols, T in ((512, 2048, 100), (37, 2048, 17), (512, 2048, 513), (45, 1000, 33), (70, 70, 64),
                          (int(rng.integers(1, 100)), int(rng.integers(1, 600)), int(rng.integers(32, 90)))):
        w = weights(rng, typ, rows, cols)
        x = rng.standard_normal((T, cols)).astype(np.float32)
        want = _core.matmul(w, typ, rows, cols, x, isa="scalar")
        got = _core.backend_matmul("cuda", w, typ, rows, cols, x)
        with switched(_core.cuda_prefer_float_tiles, False, True):
            one = _core.backend_matmul("cuda", w, typ, rows, cols, x)
            with switched(_core.cuda_prefer_row_groups, True, False):
                groups = _core.backend_matmul("cuda", w, typ, rows, cols, x)
        msg = f"{typ} {rows}x{cols} T={T}"
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=msg)
        np.testing.assert_array_equal(bits(one), bits(want), err_msg=msg + ", a block per row")
        np.testing.assert_array_equal(bits(groups), bits(want), err_msg=msg + ", blocks of 16 rows")
