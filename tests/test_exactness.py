"""The exactness helper (tests/exactness.py) can fail: with a deliberately wrong acceptance rule injected into the
decode loop it reports a difference from plain decoding, greedy and sampled; a "plain" reference that drafts is
refused; with the real rule it passes (the real rule's tests are the suite's exactness tests)."""
from __future__ import annotations

import numpy as np
import pytest

import exactness
from strata_py import speculative


_REAL_ACCEPT = speculative.accept


def _keep_one_more(inputs, out, eog):
    """Off by one: the first rejected draft is kept too."""
    keep = _REAL_ACCEPT(inputs, out, eog)
    return min(len(inputs), keep + 1)


def _skip_the_root_row(inputs, out, eog):
    """The walk starts at row 1: the first draft is never checked against the root's output."""
    T = len(inputs)
    for i in range(1, T - 1):
        if out[i] != inputs[i + 1]:
            return i + 1
    return T


def _accept_everything(inputs, out, eog):
    return len(inputs)


# (a rule that keeps fewer rows than it may is slower, never wrong: these keep more)
WRONG = {"keep one more": _keep_one_more, "skip the root row": _skip_the_root_row,
         "accept every draft": _accept_everything}


@pytest.mark.parametrize("rule", list(WRONG))
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_helper_fails_with_a_wrong_acceptance_rule(tiny_model, monkeypatch, rule, mode):
    prompt = np.random.default_rng(21).integers(0, tiny_model.n_vocab, 15).tolist()
    cfg = exactness.config(mode, seed=1, max_tokens=24)
    drafters = [exactness.Adversarial(0), exactness.Adversarial(2)]  # first draft wrong; two right, then wrong
    exactness.assert_equals_plain(tiny_model, prompt, cfg, drafters)  # the real rule passes
    monkeypatch.setattr(speculative, "accept", WRONG[rule])  # each keeps 1 of a 1-row window: plain is unchanged
    monkeypatch.setattr(speculative, "VERIFIED_PREFIX", False)  # the wrong rules read rows past the first rejection
    with pytest.raises(AssertionError, match=r"draft=adversarial\(right=[02]\).*first difference at token"):
        exactness.assert_equals_plain(tiny_model, prompt, cfg, drafters, label=rule)


def test_a_plain_reference_that_drafts_is_refused(tiny_model):
    """plain() checks that every window had one row: a generator that drafts anyway cannot be the reference."""
    from strata_py.generate import generate_ids

    def drafting_anyway(model, prompt, cfg, proposer, stats):
        return list(generate_ids(model, prompt, cfg.replace(draft="suffix"), stats=stats))

    prompt = [5, 6, 7, 8, 9] * 6  # repetitive: the suffix drafter drafts
    with pytest.raises(AssertionError, match="plain reference ran windows"):
        exactness.plain(tiny_model, prompt, exactness.config("greedy", 0, 16), drafting_anyway)


def test_config_states_every_deciding_option():
    for mode in exactness.MODES:
        cfg = exactness.config(mode, seed=4, max_tokens=9)
        assert cfg.draft == "none" and cfg.seed == 4 and cfg.max_tokens == 9 and cfg.stop_at_eos is False
        assert cfg.temperature == exactness.MODES[mode]["temperature"]
    labels = [label for label, _ in exactness.cases(seeds=(3, 5))]
    assert labels == ["greedy seed=3", "sampled seed=3", "sampled seed=5"]
