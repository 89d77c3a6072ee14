"""The edges of the decode loop (engine spec 2.3, issue 21): an end-of-generation token at every row position of
a window, with and without stop_at_eos, on a tiny model and on the shipped default model; the context limit
reached by windows that would cross it; max_tokens 0 and 1; an empty prompt (documented: generation starts
from the document separator, the BOS or else the EOS token); UTF-8 characters split across the rows of one
window, through generate() and the CLI's stream. Every output is compared with plain decoding (exactness.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import exactness
from strata_py.generate import generate, generate_ids
from strata_py.model import Model
from strata_py.speculative import LoopStats

W = 8  # windows of these tests: the root and up to 7 drafts (stated; not GenerationConfig's default)


class Offset(exactness.Oracle):
    """Always right (drafts plain decoding's own future), but the first window gets only `first` drafts: the
    later windows start `first` + 1 tokens in, so a token at output index e lands in row (e - first - 1) % W."""

    def __init__(self, plain, n0, n_vocab, first):
        super().__init__(plain, n0, None, n_vocab)
        self.first, self.windows = first, 0

    def propose(self, context, max_drafts):
        self.windows += 1
        d = super().propose(context, max_drafts)
        return d[:self.first] if self.windows == 1 else d


def _run(model, prompt, cfg, proposer, n_ctx=256):
    """generate_ids on a session of its own; returns ids, stats, the session and the rows of each emitted
    end-of-generation token inside its window."""
    eog = model.tokenizer.eog_ids
    s = model.session(n_ctx=n_ctx, max_window=W)
    rows: list[int] = []
    st = LoopStats()
    out = list(generate_ids(model, prompt, cfg, session=s, proposer=proposer, stats=st,
                            on_commit=lambda o, keep: rows.extend(i for i in range(keep) if o[i] in eog)))
    return out, st, s, rows


def _eos_bias_case(model, prompt, mode):
    """A config whose plain output has its first end-of-generation token at index >= W (so that shifting the
    window grid puts it in every row), found by raising the EOS bias; and plain's output without stopping."""
    eos = model.tokenizer.eos_id
    for seed in range(3, 13):
        for bias in np.arange(0.0, 40.0, 0.5):
            cfg = exactness.config(mode, seed=seed, max_tokens=3 * W, max_draft=W - 1, logit_bias={eos: float(bias)})
            plain = exactness.plain(model, prompt, cfg)
            first = next((i for i, t in enumerate(plain) if t in model.tokenizer.eog_ids), None)
            if first is not None:
                if first >= W:
                    return cfg, plain, first
                break  # more bias only moves it earlier: another seed
        if mode == "greedy":
            break  # the seed does not matter
    pytest.fail(f"no EOS bias puts the first end-of-generation token at index >= {W}")


def _check_eos_in_every_row(model, prompt, mode):
    cfg, plain, first = _eos_bias_case(model, prompt, mode)
    V = model.n_vocab
    for stop in (True, False):
        c = cfg.replace(stop_at_eos=stop)
        want = plain[:first + 1] if stop else plain
        assert exactness.plain(model, prompt, c) == want
        seen = set()
        for k in range(W):
            out, st, s, rows = _run(model, prompt, c, Offset(plain, len(prompt), V, k))
            assert out == want, (mode, stop, k)
            if stop:  # the EOS ends the prefix: nothing after it is committed or emitted
                assert st.stop == "eog" and rows == [(first - k - 1) % W if first > k else first]
                assert s.tokens == prompt + out[:-1] and s.position == len(prompt) + len(out) - 1
            else:
                assert st.stop == "max_tokens" and st.generated == len(plain)
            seen.update(rows[:1])
            assert max(int(t) for t in st.t_hist) == W
        assert seen == set(range(W)), (mode, stop, seen)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_eos_at_every_row_of_a_window_tiny(tiny_model, mode):
    prompt = np.random.default_rng(31).integers(0, tiny_model.n_vocab, 12).tolist()
    _check_eos_in_every_row(tiny_model, prompt, mode)


@pytest.fixture(scope="module")
def default_model():
    return Model.load(threads=2)


def test_eos_at_every_row_of_a_window_default_model(default_model):
    _check_eos_in_every_row(default_model, default_model.tokenizer.encode("import os\nimport sys\n"), "sampled")


@pytest.mark.parametrize("n_ctx", [24, 27, 31])
def test_windows_stop_at_the_context_limit(tiny_q8_model, n_ctx):
    """Always-right windows of 8 rows run into a context of n_ctx cells: the last window is cut to the room
    left, the output is plain decoding's, and it fills the context exactly."""
    m = tiny_q8_model
    prompt = np.random.default_rng(n_ctx).integers(0, m.n_vocab, 10).tolist()
    for label, cfg in exactness.cases(seeds=(2,), max_tokens=100, max_draft=W - 1):
        def gen(model, p, c, proposer, stats):
            s = model.session(n_ctx=n_ctx, max_window=W, mtp=c.draft == "mtp")
            out = list(generate_ids(model, p, c, session=s, proposer=proposer, stats=stats))
            assert s.position == n_ctx and stats.stop == "context", (label, c.draft, s.position, stats.stop)
            return out
        plain = exactness.plain(m, prompt, cfg, gen)
        assert len(plain) == n_ctx - len(prompt) + 1
        st = exactness.assert_equals_plain(m, prompt, cfg, [exactness.Adversarial(None), exactness.Adversarial(3),
                                                            "suffix", "mtp"], gen=gen, reference=plain, label=label)
        always = st[str(exactness.Adversarial(None))]
        assert max(int(t) for t in always.t_hist) == W and len(always.t_hist) > 1  # a window was cut short


def test_a_prompt_that_fills_the_context(tiny_model):
    out, st, s, _ = _run(tiny_model, list(range(1, 17)), exactness.config("greedy", 0, 10), None, n_ctx=16)
    assert len(out) == 1 and st.stop == "context" and s.position == 16
    with pytest.raises(ValueError, match="prompt of 17 tokens exceeds the context of 16 tokens"):
        _run(tiny_model, list(range(1, 18)), exactness.config("greedy", 0, 10), None, n_ctx=16)


@pytest.mark.parametrize("n", [0, 1])
def test_max_tokens_zero_and_one(tiny_q8_model, tiny_q8_gguf, n):
    m = tiny_q8_model
    prompt = [5, 6, 7, 8] * 5
    for label, cfg in exactness.cases(seeds=(1,), max_tokens=n):
        st = exactness.assert_equals_plain(m, prompt, cfg, ["suffix", "auto", "mtp", exactness.Adversarial(None)],
                                           label=label)
        assert len(st["plain"]) == n
        for k, v in st.items():
            if k != "plain":
                assert v.generated == n and v.stop == "max_tokens" and v.windows == n, (k, v.windows)
    assert "".join(generate(m, "def f(", exactness.config("greedy", 0, 0))) == ""
    r = subprocess.run([sys.executable, "-m", "strata_py.generate", "--model", str(tiny_q8_gguf), "--json", "-n", str(n),
                        "--draft", "suffix", "--temperature", "0", "--threads", "2", "def f("],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    text = "".join(generate(m, "def f(", exactness.config("greedy", 0, n, stop_at_eos=True)))
    assert d["stats"]["generated_tokens"] == n and d["text"] == text and (text != "") == (n > 0), (d["text"], text)


def test_empty_prompt_starts_from_the_document_separator(tiny_q8_model, tiny_q8_gguf):
    """The documented behaviour (generate.generate_ids): an empty prompt is the BOS token, else the EOS token."""
    m = tiny_q8_model
    tok = m.tokenizer
    start = tok.bos_id if tok.bos_id is not None else tok.eos_id
    assert start is not None
    for label, cfg in exactness.cases(seeds=(4,), max_tokens=12):
        want = exactness.plain(m, [start], cfg)
        assert len(want) == 12
        exactness.assert_equals_plain(m, [], cfg, ["suffix", "mtp"], reference=want, label=label)
        assert exactness.plain(m, [], cfg) == want
    cfg = exactness.config("greedy", 0, 12, stop_at_eos=True)
    text = "".join(generate(m, "", cfg))
    ids = exactness.plain(m, [start], cfg)
    assert text == tok.decode([t for t in ids if t not in tok.eog_ids], skip_special=True)
    r = subprocess.run([sys.executable, "-m", "strata_py.generate", "--model", str(tiny_q8_gguf), "--json", "-n", "12",
                        "--temperature", "0", "--draft", "none", "--threads", "2", ""],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == text and json.loads(r.stdout)["stats"]["generated_tokens"] == len(ids)


TEXT = "é€😀"  # 2, 3 and 4 bytes: byte tokens in the tiny model's vocabulary


def test_utf8_split_across_the_rows_of_a_window(tiny_model, tiny_gguf):
    """A regex forces the output to be TEXT four times, one byte per token; the prompt holds it three times, so
    the suffix drafter drafts it and windows end inside characters. generate() and the CLI stream yield only
    whole characters, and the text is plain decoding's."""
    tok = tiny_model.tokenizer
    assert all(len(tok.token_bytes(t)) == 1 for t in tok.encode(TEXT))
    prompt = tok.encode("x = '" + TEXT * 3)
    cfg = exactness.config("greedy", 0, 4 * 9 + 1, stop_at_eos=True, regex=f"({TEXT}){{4}}'", max_draft=W - 1)
    want = exactness.plain(tiny_model, prompt, cfg)
    assert tok.decode(want, skip_special=True) == TEXT * 4 + "'"
    cut = []  # byte offsets where windows ended
    s = tiny_model.session(n_ctx=128, max_window=W)
    data = bytearray()

    def hook(out, keep):
        data.extend(b"".join(tok.token_bytes(t) for t in out[:keep]))
        cut.append(len(data))

    st = LoopStats()
    assert list(generate_ids(tiny_model, prompt, cfg.replace(draft="suffix"), session=s, stats=st, on_commit=hook)) == want
    bounds = {len(TEXT[:i].encode()) + 9 * r for r in range(5) for i in range(4)}  # character starts
    assert st.accepted > 0 and any(c not in bounds for c in cut[:-1]), (cut, st.t_hist)
    pieces = list(generate(tiny_model, "x = '" + TEXT * 3, cfg.replace(draft="suffix")))
    assert "".join(pieces) == TEXT * 4 + "'" and all("\ufffd" not in p for p in pieces) and len(pieces) > 1
    r = subprocess.run([sys.executable, "-m", "strata_py.generate", "--model", str(tiny_gguf), "-n", str(4 * 9 + 1),
                        "--draft", "suffix", "--max-draft", str(W - 1), "--temperature", "0", "--threads", "2",
                        "--regex", f"({TEXT}){{4}}'", "x = '" + TEXT * 3], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode("utf-8") == "x = '" + TEXT * 7 + "'\n"  # strict: a split character would not decode
