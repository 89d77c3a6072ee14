"""The DRY penalty (issue 20; csrc/sampling/dry.h): the C++ processor against a brute-force reference
(tests/dry_ref.py) on random token streams, llama.cpp's own test cases, the breaker processing against a direct
check of the rule, and on the shipped model: speculative == serial with DRY on (greedy and sampled, every
drafter, adversarial drafts), the same with the default settings, and that it does break the greedy loop.
Checkpoint resume with DRY on: tests/test_steering.py::test_checkpoint_resume_equals_uninterrupted."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from dry_ref import dry_ref
from strata_py import _core
from strata_py.config import GenerationConfig
from strata_py.generate import generate_ids, make_proposer
from strata_py.model import Model
from strata_py.speculative import LoopStats
from strata_py.steering.dry import breaker_sequences
from test_speculative import _Oracle


def _core_dry(hist, mult, base, allowed, last_n, breakers, V):
    heads = [h for h, _ in breakers]
    tails = [list(t) for _, t in breakers]
    d = _core.DryPenalty(mult, base, allowed, last_n, heads, tails, V)
    ids, amounts = d.penalties(np.asarray(hist, dtype=np.int32))
    return dict(zip(ids.tolist(), amounts.tolist()))


def test_dry_matches_reference_on_random_streams():
    """Small alphabets (many repeats), breakers of one to three tokens, every parameter regime, incl. the
    exponent clamp (base 60: 60^e overflows float past e = 21)."""
    rng = random.Random(20)
    V = 12
    n_nonempty = 0
    for case in range(600):
        alpha = rng.choice([2, 3, 4, 6, V])
        n = rng.randint(0, 90)
        period = rng.randint(1, 9)
        base_seq = [rng.randrange(alpha) for _ in range(period)]
        hist = [base_seq[i % period] if rng.random() < 0.8 else rng.randrange(alpha) for i in range(n)]
        breakers = []
        for _ in range(rng.randint(0, 3)):
            breakers.append((rng.randrange(V), tuple(rng.randrange(alpha) for _ in range(rng.choice([0, 0, 1, 2])))))
        breakers = list(dict.fromkeys(breakers))
        mult = rng.choice([0.0, 0.8, 1.0, 2.5])
        base = rng.choice([1.0, 1.1, 1.75, 3.0, 60.0])
        allowed = rng.choice([0, 1, 2, 3, 5])
        last_n = rng.choice([-1, 0, 1, 4, 16, 64])
        want = dry_ref(hist, mult, base, allowed, last_n, breakers)
        got = _core_dry(hist, mult, base, allowed, last_n, breakers, V)
        assert got == want, (case, hist, mult, base, allowed, last_n, breakers)
        n_nonempty += bool(want)
    assert n_nonempty > 120


LN = math.log


@pytest.mark.parametrize("probs,last,expected,mult,base,allowed,last_n,breakers", [
    # llama.cpp tests/test-sampling.cpp test_dry cases (probabilities after DRY and softmax)
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [(3, ())]),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
])
def test_llamacpp_cases(probs, last, expected, mult, base, allowed, last_n, breakers):
    logits = np.log(np.asarray(probs, dtype=np.float32))
    for t, a in _core_dry(last, mult, base, allowed, last_n, breakers, len(probs)).items():
        logits[t] -= np.float32(a)
    p = np.exp(logits - logits.max())
    assert np.allclose(p / p.sum(), expected, atol=1e-5)


def test_bad_parameters_name_the_field():
    for kw, field in ((dict(multiplier=-1.0), "multiplier"), (dict(base=0.5), "base"),
                      (dict(allowed_length=-1), "allowed_length"), (dict(penalty_last_n=-2), "penalty_last_n")):
        args = dict(multiplier=0.8, base=1.75, allowed_length=2, penalty_last_n=-1) | kw
        with pytest.raises(ValueError, match=field):
            _core.DryPenalty(args["multiplier"], args["base"], args["allowed_length"], args["penalty_last_n"],
                             [], [], 8)
    with pytest.raises(ValueError, match="outside"):
        _core.DryPenalty(0.8, 1.75, 2, -1, [9], [[]], 8)
    for kw, field in ((dict(dry_base=0.9), "dry_base"), (dict(dry_multiplier=-0.1), "dry_multiplier"),
                      (dict(dry_penalty_last_n=-3), "dry_penalty_last_n"),
                      (dict(dry_sequence_breakers=["\n", ""]), "dry_sequence_breakers")):
        with pytest.raises(ValueError, match=field):
            GenerationConfig(**kw).validate()


@pytest.fixture(scope="module")
def model():
    return Model.load(threads=2)


def test_breaker_processing(model):
    """llama.cpp's rule, checked directly: a token containing the breaker is a single-token breaker; a token
    ending in a proper prefix of it is a head whose tail is the tokenization of the rest."""
    tok = model.tokenizer
    heads, tails = breaker_sequences(tok, model.n_vocab, ["\n", "):"])
    pairs = set(zip(heads, map(tuple, tails)))
    for t in range(model.n_vocab):
        b = tok.token_bytes(t)
        assert ((t, ()) in pairs) == (b"\n" in b or b"):" in b), t
        if b.endswith(b")") and b"):" not in b:
            assert (t, tuple(tok.encode(":"))) in pairs, t
    nl = tok.encode("\n")[0]
    assert (nl, ()) in pairs


PROMPT = "def parse_args("
SAMPLED = dict(temperature=0.8, top_p=0.95, min_p=0.05)


def _gen(model, session, prompt, cfg, proposer=None, stats=None):
    session.reset()
    return list(generate_ids(model, prompt, cfg, session=session,
                             proposer=proposer if proposer is not None else make_proposer(model, cfg), stats=stats))


def test_speculative_equals_serial_with_dry(model):
    """Suffix, MTP and adversarial drafters emit exactly plain decoding's tokens with DRY on, greedy and sampled;
    and DRY acts (the greedy output differs from DRY off and has no line three times in a row)."""
    plain_s = model.session(n_ctx=512, max_window=16)
    mtp_s = model.session(n_ctx=512, max_window=16, mtp=True)
    prompt = model.tokenizer.encode(PROMPT)
    dry = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_sequence_breakers=['"'])
    drafted = 0
    for opts in (dict(temperature=0.0), dict(SAMPLED, seed=3)):
        cfg = GenerationConfig(max_tokens=96, **opts, **dry)
        plain = _gen(model, plain_s, prompt, cfg.replace(draft="none"))
        assert len(plain) > 40
        for draft, s in (("suffix", plain_s), ("auto", plain_s), ("mtp", mtp_s)):
            st = LoopStats()
            assert _gen(model, s, prompt, cfg.replace(draft=draft), stats=st) == plain, (opts, draft)
            drafted += st.drafted
        for right in (0, 3, None):
            st = LoopStats()
            assert _gen(model, plain_s, prompt, cfg, proposer=_Oracle(plain, len(prompt), right, model.n_vocab),
                        stats=st) == plain, (opts, right)
            drafted += st.drafted
        if opts["temperature"] == 0.0:
            off = _gen(model, plain_s, prompt, GenerationConfig(max_tokens=96, temperature=0.0, dry_multiplier=0.0,
                                                              draft="none"))
            assert off != plain
            lines = [ln for ln in model.tokenizer.decode(plain).split("\n") if len(ln.strip()) > 8]
            assert not any(lines[i] == lines[i + 1] == lines[i + 2] for i in range(len(lines) - 2)), lines
    assert drafted > 0


def test_speculative_equals_serial_with_the_default_settings(model):
    """GenerationConfig()'s defaults (sampling, min-p, DRY: issue 20) keep every drafter exact."""
    plain_s = model.session(n_ctx=512, max_window=16)
    mtp_s = model.session(n_ctx=512, max_window=16, mtp=True)
    drafted = 0
    for seed, text in ((1, PROMPT), (2, "class Stack:")):
        prompt = model.tokenizer.encode(text)
        cfg = GenerationConfig(max_tokens=80, seed=seed)
        assert cfg.temperature > 0 and cfg.dry_multiplier > 0
        plain = _gen(model, plain_s, prompt, cfg.replace(draft="none"))
        for draft, s in (("auto", plain_s), ("suffix", plain_s), ("mtp+suffix", mtp_s)):
            st = LoopStats()
            assert _gen(model, s, prompt, cfg.replace(draft=draft), stats=st) == plain, (seed, draft)
            drafted += st.drafted
        st = LoopStats()
        assert _gen(model, plain_s, prompt, cfg, proposer=_Oracle(plain, len(prompt), 2, model.n_vocab),
                    stats=st) == plain
        drafted += st.drafted
    assert drafted > 0
