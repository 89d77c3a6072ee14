"""Shared by the backend and CUDA tests and bench/bench_cuda.py: random valid weights of any type the engine computes
with (synth's generator: real GGUF block bytes), and the skip mark for tests that need a CUDA device."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from strata_py import _core, synth

# every type with a CUDA kernel (csrc/kernels/cuda/decode.cuh); the rest of the CPU's types refuse on the GPU
CUDA_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4",
              "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ3_XXS", "IQ4_XS"]
NOT_ON_CUDA = ["IQ1_S", "IQ1_M", "IQ2_XS", "IQ2_S", "IQ3_S"]

needs_cuda = pytest.mark.skipif(not _core.cuda_available(), reason=f"needs a CUDA device: {_core.cuda_info()}")


def weights(rng: np.random.Generator, typ: str, rows: int, cols: int) -> np.ndarray:
    """rows x cols random valid weights of ggml type `typ` as their GGUF bytes (uint8, flat)."""
    w = synth._weight(rng, (rows, cols), QT[typ])
    return np.ascontiguousarray(w).view(np.uint8).ravel()


def bits(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns, so that equality means bit for bit (signed zeros and NaN payloads included)."""
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@contextmanager
def pdl(mode: str):
    """Kernel launches for the block (cuda_prefer_pdl): "on" (programmatic dependent launch and the weight prefetch,
    plain launches for the verify windows of 5..16 rows: the default), "all" (PDL for those windows too),
    "no-prefetch" or "off"; the default restored after."""
    _core.cuda_prefer_pdl(mode != "off", mode in ("on", "all"), mode == "all")
    try:
        yield
    finally:
        _core.cuda_prefer_pdl(True, True)


@contextmanager
def tensor_cores(on: bool, min_rows: int = 5):
    """The IQ2_XXS products' kernels for the block (cuda_prefer_mma), the default (on, 5 rows) restored after."""
    _core.cuda_prefer_mma(on, min_rows)
    try:
        yield
    finally:
        _core.cuda_prefer_mma(True)


@contextmanager
def iq2_rows(dense: int, sel: int, pair: int):
    """The weight rows a warp of the IQ2_XXS one-row kernel takes for the block (cuda_prefer_iq2_rows), in the dense
    products, the experts' products and the experts' fused gate / up; the defaults (1, 4, 1) restored after."""
    _core.cuda_prefer_iq2_rows(dense, sel, pair)
    try:
        yield
    finally:
        _core.cuda_prefer_iq2_rows(1, 4, 1)


@contextmanager
def switched(setter, on, default):
    """A kernel switch of _core (cuda_prefer_iq2_panel, cuda_prefer_dn_duo, cuda_prefer_row_groups; the byte bound
    of cuda_prefer_float_split) set to `on` for the block, its default restored after."""
    setter(on)
    try:
        yield
    finally:
        setter(default)


@contextmanager
def prompt_rows(rows: int):
    """The rows of a prompt piece on the card for the sessions made in the block (cuda_prefer_prompt_rows), the
    setting found restored after."""
    prev = _core.cuda_prompt_rows()
    _core.cuda_prefer_prompt_rows(rows)
    try:
        yield
    finally:
        _core.cuda_prefer_prompt_rows(prev)
