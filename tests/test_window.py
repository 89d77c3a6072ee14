"""Window parity (engine spec 2.5): after run(T) + commit(keep), every logit and every piece of state is
bit-identical to serial T = 1 decoding of the kept tokens, for every T <= 16 (the loop's default window; the
spec asks for 8, kernels take 8 rows per pass), keep, pos0 mod 4 and fold mode."""
from __future__ import annotations

import numpy as np
import pytest

from strata_py import GenerationConfig

W = GenerationConfig().max_window  # the largest window the decode loop runs by default
import exactness
from strata_py.speculative import decode
from window_util import (assert_same_state as _same_state, check_every_window_and_keep,
                         check_random_windows, serial_reference as _serial)

FOLDS = ("lazy", "eager", "partial")


@pytest.mark.parametrize("which", ["tiny_model", "tiny_q8_model"])
@pytest.mark.parametrize("fold", FOLDS)
def test_every_window_and_keep(request, which, fold):
    # pos0 covers every value mod 4 (prompt windows > W commit all)
    check_every_window_and_keep(request.getfixturevalue(which), fold, (W + 1, W + 2, W + 3, W + 4),
                                np.random.default_rng(7), W)


@pytest.mark.parametrize("fold", FOLDS)
def test_export_after_commit_flushes_fold(tiny_model, fold):
    rng = np.random.default_rng(3)
    prompt, seq = rng.integers(0, tiny_model.n_vocab, 9).tolist(), rng.integers(0, tiny_model.n_vocab, 8).tolist()
    _, ref_states = _serial(tiny_model, prompt, seq)
    s = tiny_model.session(n_ctx=128, fold=fold)
    s.run(prompt)
    s.commit(9)
    s.run(seq[:6])
    s.commit(4)
    _same_state(s.export_state(), ref_states[4])


@pytest.mark.parametrize("fold", FOLDS)
def test_long_random_windows(tiny_q8_model, fold):
    """Long random sequences of windows and keeps end in the serial state with serial logits."""
    check_random_windows(tiny_q8_model, fold, np.random.default_rng(11), W)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("fold", FOLDS)
def test_speculative_equals_serial(tiny_model, temperature, fold):
    """Windowed decoding with adversarial drafts emits exactly the serial tokens, greedy and sampled."""
    cfg = GenerationConfig(max_tokens=40, temperature=temperature, top_k=50, top_p=0.95, seed=5,
                           repetition_penalty=1.1, stop_at_eos=False, draft="none")
    prompt = list(range(3, 15))
    def run(m, p, c, proposer, stats):
        s = m.session(n_ctx=128, fold=fold)
        s.run(p[:-1])
        s.commit(len(p) - 1)
        return list(decode(s, p[-1], c, set(), stats, proposer))
    serial = exactness.plain(tiny_model, prompt, cfg, run)
    assert len(serial) == 40
    exactness.assert_equals_plain(tiny_model, prompt, cfg, [exactness.Adversarial(r) for r in range(8)], gen=run,
                                  reference=serial)
