"""Session.logprobs (csrc/sampling/logprobs.h) against torch's log_softmax on the same raw logits, and
Checkpoint.nbytes against the arrays a checkpoint holds (the prefix cache's budget)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata_py.config import GenerationConfig
from strata_py.generate import generate_ids
from strata_py.speculative import LoopStats


def test_logprobs_match_torch(tiny_model):
    rng = np.random.default_rng(7)
    s = tiny_model.session(n_ctx=64, max_window=8)
    ids = rng.integers(0, tiny_model.n_vocab, size=7).tolist()
    logits = s.run(ids).copy()  # a verify window: every row's logits
    s.commit(len(ids))
    chosen = rng.integers(0, tiny_model.n_vocab, size=len(ids)).tolist()
    lp, top_ids, top_lp = s.logprobs(chosen, top_n=5)
    ref = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), dim=-1)
    np.testing.assert_allclose(lp, ref[torch.arange(len(ids)), chosen].numpy(), rtol=0, atol=2e-6)
    vals, idx = ref.topk(5, dim=-1)
    np.testing.assert_array_equal(top_ids, idx.numpy())
    np.testing.assert_allclose(top_lp, vals.numpy(), rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="rows"):
        s.logprobs(chosen + [1], top_n=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.logprobs([tiny_model.n_vocab], top_n=0)


def test_logprobs_same_in_windows_and_serial(tiny_model):
    """The hook sees each emitted token's row: speculative windows give the serial log-probabilities, bitwise."""
    cfg = GenerationConfig(max_tokens=24, temperature=0.0, stop_at_eos=False)
    prompt = list(range(3, 20)) * 3  # repetitive: the suffix drafter drafts

    def run(draft):
        s = tiny_model.session(n_ctx=256, max_window=16)
        seen: list[tuple[int, float]] = []

        def hook(out, keep):
            lp, _, _ = s.logprobs(out[:keep])
            seen.extend(zip(out[:keep], lp.tolist()))
        stats = LoopStats()
        ids = list(generate_ids(tiny_model, prompt, cfg.replace(draft=draft), session=s, on_commit=hook, stats=stats))
        return ids, seen, stats

    ids0, seen0, _ = run("none")
    ids1, seen1, st = run("suffix")
    assert st.drafted > 0
    assert ids0 == ids1 == [t for t, _ in seen0]
    assert seen0 == seen1


def test_checkpoint_nbytes(tiny_model):
    s = tiny_model.session(n_ctx=64)
    s.run(list(range(10)))
    s.commit(10)
    cp = s.checkpoint()
    state = s.export_state()  # per layer K/V cells below the position, or S and conv
    expect = sum(a.nbytes for a in state.values()) + 4 * 10
    assert cp.nbytes == expect
