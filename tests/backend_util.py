"""Backend sessions against the native CPU session (tests/test_backend_forward.py on the CPU backend,
tests/test_cuda_forward.py on the GPU): the same windows on both, every logit compared bit for bit."""
from __future__ import annotations

import numpy as np

from strata_py import GenerationConfig
from strata_py.generate import generate_ids


def tiny_qwen35moe(d, seed: int, threads: int):
    """A tiny qwen35moe model (the Split DeltaNet layout) built with transformers in d and converted by ours."""
    from hf_tiny_next import make_tiny_qwen35moe
    from strata_py.convert import convert
    from strata_py.model import Model
    make_tiny_qwen35moe(d / "hf", seed=seed)
    return Model.load(convert(d / "hf", d / "q35.gguf", "q8_0"), threads=threads)


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).view(np.uint32)


def assert_same(a, b, label):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape, f"{label}: shapes {a.shape} vs {b.shape}"
    if not np.array_equal(bits(a), bits(b)):
        bad = np.argwhere(bits(a) != bits(b))
        raise AssertionError(f"{label}: {len(bad)} of {a.size} logits differ (first at {bad[0].tolist()}: "
                             f"{a[tuple(bad[0])]!r} vs {b[tuple(bad[0])]!r})")


def windows_equal(model, backend, rng, *, n_windows=12, max_window=16, n_ctx=256, prompt=None, label=""):
    """A prompt window, T = 1 steps and verify windows of random T (1..max_window) with random keeps, on a native
    session and on `backend`: logits (all rows, and last_only) and hidden rows bit for bit at every run."""
    V = model.n_vocab
    ref = model.session(n_ctx=n_ctx, max_window=max_window, backend="cpu")
    got = model.session(n_ctx=n_ctx, max_window=max_window, backend=backend)
    p = int(rng.integers(max_window + 1, 2 * max_window + 4)) if prompt is None else prompt
    toks = rng.integers(0, V, p).tolist()
    assert_same(ref.run(toks), got.run(toks), f"{label} prompt of {p}")
    assert_same(ref._core.hidden(), got._core.hidden(), f"{label} prompt hidden")
    ref.commit(p)
    got.commit(p)
    for w in range(n_windows):
        T = 1 if w % 4 == 0 else int(rng.integers(1, max_window + 1))
        toks = rng.integers(0, V, T).tolist()
        last_only = w % 5 == 3
        where = f"{label} window {w} (T = {T}, at {ref.position}{', last_only' if last_only else ''})"
        assert_same(ref.run(toks, last_only=last_only), got.run(toks, last_only=last_only), where)
        assert_same(ref._core.hidden(), got._core.hidden(), where + " hidden")
        keep = int(rng.integers(1, T + 1))
        ref.commit(keep)
        got.commit(keep)
    assert ref.tokens == got.tokens


def continue_equal(a, b, rng, V, steps, label=""):
    """The same T = 1 steps and verify windows (random keeps) on sessions a and b: logits bit for bit."""
    for w in range(steps):
        T = 1 if w % 2 == 0 else int(rng.integers(2, 9))
        toks = rng.integers(0, V, T).tolist()
        assert_same(a.run(toks), b.run(toks), f"{label} window {w} (T = {T}, at {a.position})")
        keep = int(rng.integers(1, T + 1))
        a.commit(keep)
        b.commit(keep)
    assert a.tokens == b.tokens and a.position == b.position


def decode_equal(model, backend, rng, *, temperature, draft, max_tokens=24, label=""):
    """generate_ids on a native session and on `backend`: the same tokens (greedy or sampled, plain or drafted)."""
    cfg = GenerationConfig(max_tokens=max_tokens, temperature=temperature, draft=draft, seed=int(rng.integers(1 << 30)),
                           stop_at_eos=False)
    prompt = rng.integers(0, model.n_vocab, int(rng.integers(3, 12))).tolist()
    prompt = prompt + prompt[:3] * 3  # repeats give the suffix drafter something to draft
    outs = []
    for b in ("cpu", backend):
        s = model.session(n_ctx=256, max_window=cfg.max_window, backend=b, mtp="mtp" in draft)
        outs.append(list(generate_ids(model, prompt, cfg, session=s)))
    assert outs[0] == outs[1], f"{label}: {backend} decoded {outs[1]}, cpu {outs[0]}"
    return outs[0]
