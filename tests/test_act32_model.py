"""The 32-value block types with int8 activations end to end (Q4_0, MXFP4, and Q4_1 for the min term; matmul.h,
act32.h): the trained default model's Q8_0 matrices requantized by gguf-py, run by the engine, against transformers
on exactly the dequantized weights. The activations are rounded to int8 per 32 values: |x - dx*q| <= dx/2 with dx = amax/127, an
rms error of dx/sqrt(12) ~ 0.45 % of the rms value on Gaussian inputs (amax ~ 2 sigma over 32), a little below the
K-quants' 0.6 % per 256 values (tests/test_kquant_model.py). Stated tolerances, per position ||diff|| / ||ref||
over a held-out snippet of 200 tokens: median <= 5e-2 (measured 0.017 for Q4_0, 0.020 for MXFP4, 0.018 for Q4_1),
max <= 0.35 (measured 0.22 / 0.20 / 0.25: positions where the small errors flip a top-4-of-32 expert choice), greedy
tokens agree at >= 95 % of positions (measured 98.5 % / 98.0 % / 98.5 %). Windows stay bit-identical to serial
decoding."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from requantized import against_transformers, requantize
from strata_py.model import Model, default_model_path
from window_util import assert_windows_equal_serial

MEDIAN_TOL, MAX_TOL, GREEDY = 5e-2, 0.35, 0.95


@pytest.fixture(scope="module", params=["Q4_0", "MXFP4", "Q4_1"])
def requantized(request, tmp_path_factory):
    typ = request.param
    out = tmp_path_factory.mktemp(typ) / f"default-{typ}.gguf"
    n = requantize(default_model_path(), out, QT[typ], lambda x: gguf.quants.quantize(x, QT[typ]))
    assert n > 50
    return typ, out


def test_matches_transformers_on_dequantized_weights(requantized, tmp_path):
    typ, path = requantized
    rel, agree = against_transformers(path, tmp_path)
    msg = f"{typ}: relative logit error median {np.median(rel):.4f}, max {rel.max():.4f}, greedy {agree:.3f}"
    assert np.median(rel) <= MEDIAN_TOL and rel.max() <= MAX_TOL, msg
    assert agree >= GREEDY, msg


def test_windows_equal_serial(requantized):
    typ, path = requantized
    assert_windows_equal_serial(Model.load(path, threads=2), windows=(3, 9), label=typ)
