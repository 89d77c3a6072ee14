"""Window parity for qwen35moe and qwen4exp (engine spec 2.5 and 7): after run(T) + commit(keep), every logit and
every piece of state (K/V, DeltaNet S and conv history, QSA raw index keys and pooled block keys, the PLE conv
history) is bit-identical to serial T = 1 decoding of the kept tokens, for every T <= 16, every keep, pos0 mod 4
and fold mode, at contexts below the QSA budget (dense) and above it (sparse), windows starting at every offset
inside a 4-token block and crossing block boundaries; the old engine's QSA tail case list (every committed length
mod 4, every T <= 8, every keep) passes with 0 failures; random windows; speculative == plain with suffix and
adversarial drafts, greedy and sampled; checkpoints (memory and file) carry the new state."""
from __future__ import annotations

import numpy as np
import pytest

from hf_tiny_next import make_tiny_qwen35moe, make_tiny_qwen4exp
from strata_py import GenerationConfig
from strata_py.convert import convert
from strata_py.model import Model
from strata_py.speculative import decode
import exactness
from window_util import assert_same_state, check_every_window_and_keep, check_random_windows, serial_reference

W = GenerationConfig().max_window  # 16
FOLDS = ("lazy", "eager", "partial")


@pytest.fixture(scope="module")
def q4(tmp_path_factory):
    d = tmp_path_factory.mktemp("q4w")
    make_tiny_qwen4exp(d / "hf", seed=21)
    return Model.load(convert(d / "hf", d / "q4.gguf", "f32"), threads=2)


@pytest.fixture(scope="module")
def q35(tmp_path_factory):
    d = tmp_path_factory.mktemp("q35w")
    make_tiny_qwen35moe(d / "hf", seed=22)
    return Model.load(convert(d / "hf", d / "q35.gguf", "q8_0"), threads=2)


@pytest.mark.parametrize("fold", FOLDS)
def test_qwen4exp_every_window_and_keep(q4, fold):
    # prompts > W (prompt windows commit all); 17..20 covers pos0 mod 4 with QSA already sparse (budget 8),
    # and the windows start at every offset of a block and cross up to four block boundaries
    check_every_window_and_keep(q4, fold, (W + 1, W + 2, W + 3, W + 4), np.random.default_rng(7), W)


def test_qwen4exp_windows_below_the_budget(q4):
    """Short contexts: a window that runs from dense rows (<= 2 complete blocks) into sparse ones."""
    rng = np.random.default_rng(8)
    V = q4.n_vocab
    for p0 in (1, 2, 3, 4, 5, 6, 7, 8):
        prompt = rng.integers(0, V, p0).tolist()
        seq = rng.integers(0, V, 12).tolist()
        ref_logits, ref_states = serial_reference(q4, prompt, seq)
        s = q4.session(n_ctx=128, max_window=W)
        s.run(prompt)
        s.commit(p0)
        base = s.checkpoint()
        for T in range(1, 11):
            for keep in (1, T // 2 + 1, T):
                s.restore(base)
                out = s.run(seq[:T])
                np.testing.assert_array_equal(out, np.asarray(ref_logits[:T]), err_msg=f"p0={p0} T={T}")
                s.commit(keep)
                assert_same_state(s.export_state(), ref_states[keep], f"p0={p0} T={T} keep={keep}")


@pytest.mark.parametrize("fold", ("lazy", "partial"))
def test_qwen35moe_every_window_and_keep(q35, fold):
    check_every_window_and_keep(q35, fold, (W + 1, W + 2, W + 3, W + 4), np.random.default_rng(9), W)


def test_qsa_tail_case_list(q4):
    """The case list of the old engine's QSA tail defect (background note "qsa"): committed lengths of every value
    mod 4 (here past the budget, so the tail matters to selection), every T <= 8, every keep; after the window
    and its commit, two more windows that complete and cross blocks; every logit and state equal to serial.
    The old engine's 4-slot ring failed 736 of these cases."""
    rng = np.random.default_rng(12)
    V = q4.n_vocab
    failures, cases = [], 0
    for L in (20, 21, 22, 23):
        prompt = rng.integers(0, V, L).tolist()
        seq = rng.integers(0, V, 8 + 10).tolist()
        s = q4.session(n_ctx=128, max_window=W)
        s.run(prompt)
        s.commit(L)
        base = s.checkpoint()
        for T in range(1, 9):
            for keep in range(1, T + 1):
                cases += 1
                # the kept rows, then a corrected continuation of 10 tokens in windows of 3 and 7
                kept = seq[:keep]
                cont = [(t + 1) % V for t in seq[keep:keep + 10]]
                ref_logits, ref_states = serial_reference(q4, prompt, kept + cont)
                s.restore(base)
                s.run(seq[:T])
                s.commit(keep)
                a = s.run(cont[:3])
                s.commit(3)
                b = s.run(cont[3:10])
                s.commit(7)
                got = np.concatenate([a, b])
                ok = np.array_equal(got, np.asarray(ref_logits[keep:keep + 10]))
                st = s.export_state()
                ok = ok and all(np.array_equal(st[k], ref_states[-1][k]) for k in st)
                if not ok:
                    failures.append((L, T, keep))
    assert cases == 4 * 36
    assert failures == []


@pytest.mark.parametrize("which", ["q4", "q35"])
@pytest.mark.parametrize("fold", FOLDS)
def test_long_random_windows(request, which, fold):
    check_random_windows(request.getfixturevalue(which), fold, np.random.default_rng(11), W, n_windows=30)


@pytest.mark.parametrize("which", ["q4", "q35"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_speculative_equals_serial(request, which, temperature):
    """Adversarial drafts (right for k tokens, then wrong) and the suffix drafter emit exactly the serial tokens."""
    model = request.getfixturevalue(which)
    cfg = GenerationConfig(max_tokens=48, temperature=temperature, top_k=50, top_p=0.95, seed=5,
                           repetition_penalty=1.1, stop_at_eos=False, draft="none")
    prompt = list(range(3, 21))

    def run(m, p, c, proposer, stats):
        s = m.session(n_ctx=160, fold="lazy")
        s.run(p[:-1])
        s.commit(len(p) - 1)
        return list(decode(s, p[-1], c, set(), stats, proposer))

    serial = exactness.plain(model, prompt, cfg, run)
    assert len(serial) == 48
    exactness.assert_equals_plain(model, prompt, cfg, [exactness.Adversarial(r) for r in (0, 1, 2, 3, 5, 9)],
                                  gen=run, reference=serial)
    # a repetitive prompt so that suffix lookup drafts
    rep = (prompt * 4)[:64]
    exactness.assert_equals_plain(model, rep, cfg, ["suffix", "auto"])


def test_checkpoints_carry_the_new_state(q4, tmp_path):
    """Memory and file checkpoints hold the QSA index keys and the PLE history: save, run another
    conversation, restore, continue == uninterrupted."""
    rng = np.random.default_rng(13)
    V = q4.n_vocab
    a = rng.integers(0, V, 37).tolist()
    cont = rng.integers(0, V, 9).tolist()
    other = rng.integers(0, V, 29).tolist()
    ref = q4.session(n_ctx=128)
    ref.run(a)
    ref.commit(len(a))
    want = ref.run(cont)
    s = q4.session(n_ctx=128)
    s.run(a[:30])
    s.commit(30)
    s.run(a[30:])  # a verify window with a pending lazy fold and saved PLE rows
    s.commit(len(a) - 30)
    cp = s.checkpoint()
    st = s.export_state()
    assert any(k.endswith("idx_raw") for k in st) and any(k.endswith("idx_pooled") for k in st)
    assert any(k.endswith("ple_conv") for k in st)
    s.save(tmp_path / "cp.bin")
    s.reset()
    s.run(other)
    s.commit(len(other))
    s.restore(cp)
    np.testing.assert_array_equal(s.run(cont), want)
    s.commit(len(cont))
    t = q4.load_session(tmp_path / "cp.bin", n_ctx=128)
    np.testing.assert_array_equal(t.run(cont), want)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_steered_speculative_equals_serial(q4, temperature):
    """Steered decoding (logit bias, phrase penalties and bans, a regex grammar, a stop string) on qwen4exp:
    suffix and adversarial drafts emit exactly the plain tokens."""
    tok = q4.tokenizer
    bias = {tok.encode(" the")[0]: -3.0, tok.encode(" self")[0]: 2.0}
    cfg = GenerationConfig(max_tokens=40, temperature=temperature, seed=7, stop_at_eos=False, draft="none", logit_bias=bias,
                           ban_phrases=[("return self", float("inf")), ("if not", 4.0)],
                           regex=r"[a-z_ ().,=\n]{1,60}", stop=["\n\n"])
    prompt = tok.encode("def f(self, x):\n    return self.x\ndef g(self, x):\n    return self.x\ndef h(self")
    plain = exactness.plain(q4, prompt, cfg)
    assert plain
    exactness.assert_equals_plain(q4, prompt, cfg, ["suffix"] + [exactness.Adversarial(r) for r in (0, 2, 5)],
                                  reference=plain)
