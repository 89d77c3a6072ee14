"""The model forward over the backend interface (csrc/model/backend_forward.cpp) on the CPU backend: logits and
hidden rows bit-identical to the native CPU forward (Session.run) for T = 1, prompt windows (longer than the
forward's 64-row pieces too) and verify windows T = 1..16 with random keeps, on the tiny models (f32, q8_0), the
shipped default model and a qwen35moe model (the Split DeltaNet layout); greedy and sampled decoding, plain and
with suffix drafts, give the native tokens. This is what keeps the backend forward honest without a GPU (the GPU
runs the same forward: tests/test_cuda_forward.py). What a backend session does not run yet is refused by name."""
from __future__ import annotations

import pytest

from backend_util import decode_equal, tiny_qwen35moe, windows_equal
from seeds import fresh_rng
from strata_py import _core
from strata_py.model import Model

B = "cpu-backend"


@pytest.fixture(scope="module")
def default_model():
    return Model.load(threads=2)


@pytest.fixture(scope="module")
def q35(tmp_path_factory):
    return tiny_qwen35moe(tmp_path_factory.mktemp("q35b"), seed=23, threads=2)


@pytest.mark.parametrize("which", ["tiny_model", "tiny_q8_model", "default_model", "q35"])
def test_windows_equal_native(request, which):
    windows_equal(request.getfixturevalue(which), B, fresh_rng(), label=which)


def test_prompt_longer_than_a_piece(tiny_q8_model):
    """A 150-row prompt window runs in pieces of 64 rows on the backend: the same logits as one native window."""
    windows_equal(tiny_q8_model, B, fresh_rng(), n_windows=4, prompt=150, n_ctx=320, label="150-row prompt")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("draft", ["none", "suffix"])
def test_decode_equal_native(tiny_q8_model, temperature, draft):
    decode_equal(tiny_q8_model, B, fresh_rng(), temperature=temperature, draft=draft, label=f"{draft} t={temperature}")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculative_equals_plain_on_the_backend(default_model, temperature):
    """Plain and suffix-drafted decoding on the backend, same prompt and seed: the same tokens (each also equal
    to the native session's)."""
    seed = int(fresh_rng().integers(1 << 62))
    import numpy as np
    plain = decode_equal(default_model, B, np.random.default_rng(seed), temperature=temperature, draft="none")
    drafted = decode_equal(default_model, B, np.random.default_rng(seed), temperature=temperature, draft="suffix")
    assert plain == drafted


def test_refusals_name_the_option(tiny_q8_model):
    m = tiny_q8_model
    with pytest.raises(ValueError, match="bad option backend='tpu'"):
        m.session(backend="tpu")
    with pytest.raises(ValueError, match="bad option fold='partial'"):
        m.session(backend=B, fold="partial")
    with pytest.raises(ValueError, match="bad option prefill='chunked'"):
        m.session(backend=B, prefill="chunked")
    s = m.session(backend=B)
    assert s._core.backend == B and s._core.backend_name == "cpu"
    s.run([1, 2, 3])
    s.commit(3)
    for what, call in (("checkpoint", lambda: s._core.checkpoint()), ("export_state", lambda: s._core.export_state())):
        with pytest.raises(RuntimeError, match=f"{what}\\(\\): not supported on backend='{B}'"):
            call()
    s.run([4])  # still usable after the refusals
    s.commit(1)


@pytest.mark.skipif(_core.cuda_available(), reason="a CUDA device is usable here")
def test_cuda_without_a_gpu_says_why(tiny_q8_model):
    with pytest.raises(RuntimeError, match="backend='cuda'.*(STRATA_CUDA=ON|no usable CUDA device)"):
        Model.load(tiny_q8_model.path, backend="cuda")
    with pytest.raises(RuntimeError, match="STRATA_CUDA=ON|no usable CUDA device"):
        tiny_q8_model.session(backend="cuda")


@pytest.mark.skipif(_core.cuda_available(), reason="a CUDA device is usable here")
def test_cli_backend_cuda_without_a_gpu(tiny_q8_model):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "strata_py", "--model", str(tiny_q8_model.path),
                        "--backend", "cuda", "--max-tokens", "2", "hello"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "backend='cuda' (--backend cuda)" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("tool", ["serve", "chat"])
def test_server_and_chat_refuse_a_backend(tool, capsys):
    """The server's and chat's prompt cache restores checkpoints, which a backend session does not take yet."""
    import importlib
    main = importlib.import_module(f"strata_py.{tool}").main
    assert main(["--backend", B]) == 2
    assert "bad option --backend cpu-backend" in capsys.readouterr().err
