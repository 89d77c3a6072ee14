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
