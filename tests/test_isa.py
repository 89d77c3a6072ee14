"""Every kernel path in a whole model, on every run: the model-level checks (transformers parity, window parity)
with the kernels forced to each ISA this CPU has, so that an AVX-512 machine also runs the AVX2 and scalar paths
(rowops, attention, DeltaNet rows, every matmul type) end to end. `pytest --isa avx2` (conftest) runs the whole
suite as on an AVX2-only CPU instead."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_tiny import make_tiny_hf
from hf_tiny_next import make_tiny_qwen4exp
from strata_py import _core, synth
from strata_py.convert import convert
from strata_py.model import Model
from window_util import assert_windows_equal_serial

_ORDER = ("scalar", "avx2", "avx512")
ISAS = _ORDER[: _ORDER.index(_core.best_isa()) + 1]


@pytest.fixture(params=ISAS)
def isa(request):
    prev = _core.active_isa()
    _core.force_isa(request.param)
    yield request.param
    _core.force_isa(prev)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf-isa")
    model = make_tiny_hf(d, seed=5)
    return convert(d, d / "tiny.gguf", "f32"), model


@pytest.fixture(scope="module")
def hf_qwen4exp(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf-isa-q4")
    model = make_tiny_qwen4exp(d / "hf", seed=6)
    return convert(d / "hf", d / "tiny.gguf", "f32"), model


@pytest.mark.parametrize("which", ["hf", "hf_qwen4exp"])
def test_transformers_parity_on_each_path(request, which, isa):
    path, ref_model = request.getfixturevalue(which)
    model = Model.load(path, threads=2)
    ids = np.random.default_rng(2).integers(0, model.n_vocab, 40).tolist()  # QSA sparse from position 11
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    s = model.session(n_ctx=64)
    got = s.run(ids)
    rel = np.max(np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1))
    assert rel <= 1e-4, f"{isa}: {rel:.2e}"


@pytest.mark.parametrize("typ", ["f32", "q8_0", "q4_k", "iq2_xxs", "iq4_xs"])
def test_windows_equal_serial_on_each_path(tmp_path_factory, typ, isa):
    path = tmp_path_factory.getbasetemp() / f"isa-{typ}.gguf"
    if not path.exists():
        synth.write("tiny", path, typ, seed=9)
    model = Model.load(path, threads=2)
    assert_windows_equal_serial(model, windows=(2, 5, 9), label=f"{typ} {isa}")
