"""The model forward over the backend interface (csrc/model/backend_forward.cpp) on the CPU backend: logits and
hidden rows bit-identical to the native CPU forward (Session.run) for T = 1, prompt windows (longer than the
forward's 64-row pieces too) and verify windows T = 1..16 with random keeps, on the tiny models (f32, q8_0), the
shipped default model and a qwen35moe model (the Split DeltaNet layout); greedy and sampled decoding, plain and
with suffix drafts, give the native tokens. This is what keeps the backend forward honest without a GPU (the GPU
runs the same forward: tests/test_cuda_forward.py). What a backend session does not run yet is refused by name."""
from __future__ import annotations

import pytest

from backend_util import continue_equal, decode_equal, tiny_qwen35moe, windows_equal
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
    with pytest.raises(RuntimeError, match=f"export_state\\(\\): not supported on backend='{B}'"):
        s._core.export_state()
    s.run([4])  # still usable after the refusal
    s.commit(1)
    s.run([5, 6])  # a verify window pending: no checkpoint of half a step
    with pytest.raises(RuntimeError, match="checkpoint\\(\\) while a commit is pending"):
        s.checkpoint()
    s.commit(1)


@pytest.mark.parametrize("which", ["tiny_q8_model", "q35"])
def test_checkpoints_move_between_backends(request, which, tmp_path):
    """A checkpoint holds the CPU session's layouts on every backend: one taken on the native session restores on
    the backend and one taken on the backend restores natively, in memory and through a file, and continuing
    from either gives the native session's logits bit for bit. Restoring an older checkpoint on the backend
    returns it there (the server's prompt cache)."""
    m = request.getfixturevalue(which)
    rng, V = fresh_rng(), m.n_vocab
    native = m.session(n_ctx=160, max_window=8)
    prompt = rng.integers(0, V, int(rng.integers(10, 40))).tolist()
    native.run(prompt)
    native.commit(len(prompt))
    cp0 = native.checkpoint()
    back = m.session(n_ctx=160, max_window=8, backend=B)
    back.restore(cp0)  # native -> backend
    continue_equal(native, back, rng, V, 6, f"{which} native -> backend")
    cp1 = back.checkpoint()  # backend -> native, in memory and by file
    back.save(tmp_path / "b.ckpt")
    again = m.session(n_ctx=160, max_window=8)
    again.restore(cp1)
    continue_equal(native, again, rng, V, 4, f"{which} backend -> native")
    from_file = m.session(n_ctx=160, max_window=8)
    from_file.load(tmp_path / "b.ckpt")
    back.restore(cp0)  # the backend back to the prompt, the file's session from cp1: each against a native twin
    twin0 = m.session(n_ctx=160, max_window=8)
    twin0.restore(cp0)
    continue_equal(twin0, back, rng, V, 4, f"{which} backend restored to the prompt")
    twin1 = m.session(n_ctx=160, max_window=8, backend=B)
    twin1.load(tmp_path / "b.ckpt")
    continue_equal(from_file, twin1, rng, V, 4, f"{which} file on both")


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


def test_chat_runs_on_a_backend():
    """The terminal chat on a backend session: its prompt cache takes checkpoints there (two turns, piped in)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "strata_py.chat", "--backend", B, "--threads", "2", "--max-tokens", "8",
                        "--temperature", "0"], input="def add(a, b):\nand multiply\n", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bad option" not in r.stderr and "error" not in r.stderr.lower(), r.stderr[-3000:]
