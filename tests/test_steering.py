"""Steered decoding (issue 15) on the shipped default model: every processor and their combination is exact
under speculation (suffix, MTP and adversarial drafters == plain decoding, greedy and sampled); the phrase
automaton against a brute-force matcher; the row finish against a numpy reference; the token-mask kernels
against their twins; bans that hold over 200 samples; JSON-schema outputs that validate; checkpoints that
resume a steered generation exactly; stop strings across tokens, streamed."""
from __future__ import annotations

import json
import math

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_py import _core, speculative
from strata_py.config import GenerationConfig
from strata_py.generate import generate_ids, make_proposer
from strata_py.model import Model, sampling_params
from strata_py.speculative import LoopStats, decode, prefill
from strata_py.steering import Steering, TextStream
from strata_py.steering.phrases import ENDS_BOUNDARY, EOG, NEWLINE, STARTS_WORD, automaton, token_flags
import exactness

INF = math.inf
PROMPT = "import os\n"
SYS_PROMPT = "#!/usr/bin/env python\nimport os\n"  # the shipped model's greedy continuation starts "import sys\nimport"


@pytest.fixture(scope="module")
def model():
    return Model.load(threads=2)


@pytest.fixture(scope="module")
def sessions(model):
    """One plain and one MTP session, reset per generation (cheaper than a session per generation)."""
    return {False: model.session(n_ctx=256, max_window=16), True: model.session(n_ctx=256, max_window=16, mtp=True)}


def _tok(model, text):
    ids = model.tokenizer.encode(text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _gen(model, sessions, prompt_ids, cfg, proposer=None, stats=None):
    if proposer is None:
        proposer = make_proposer(model, cfg)
    s = sessions[bool(getattr(proposer, "needs_mtp", False))]
    s.reset()
    return list(generate_ids(model, prompt_ids, cfg, session=s, proposer=proposer, stats=stats))


def _gen_on(sessions):
    """_gen as exactness.py calls a generator: gen(model, prompt, cfg, proposer, stats)."""
    return lambda m, p, c, proposer, stats: _gen(m, sessions, p, c, proposer=proposer, stats=stats)


def _configs(model):
    sys_, imp, frm = _tok(model, " sys"), _tok(model, "import"), _tok(model, "from")
    bias = {sys_: -INF, imp: -2.0, frm: 1.5}
    phrases = [("import sys", INF), ("from typing import", 3.0), ("os.path", 5.0), ("import re", 2.0)]
    regex = r"((import|from) [a-z_.]+( import [a-zA-Z_, ]+)?\n){1,4}"
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "n": {"type": "integer"}}, "required": ["name", "n"],
              "additionalProperties": False}
    return {
        "bias": dict(logit_bias=bias),
        "phrases": dict(ban_phrases=phrases),
        "regex": dict(regex=regex),
        "json": dict(json_schema=schema),
        "all": dict(logit_bias=bias, ban_phrases=phrases, regex=regex, stop=["\nfrom"]),
    }


@pytest.mark.parametrize("which", ["bias", "phrases", "regex", "json", "all"])
def test_speculative_equals_serial(model, sessions, which):
    """Suffix, MTP and adversarial drafters emit exactly plain decoding's tokens, greedy and sampled."""
    prompt = model.tokenizer.encode(PROMPT)
    steer = _configs(model)[which]
    gen = _gen_on(sessions)
    drafted = 0
    for label, cfg in exactness.cases(seeds=(1, 2), max_tokens=32, stop_at_eos=True, **steer):
        plain = exactness.plain(model, prompt, cfg, gen)
        assert plain, which
        if which in ("regex", "json", "all"):  # lazy masks (the default) == full masks
            speculative.LAZY_MASKS = False
            try:
                exactness.assert_equals_plain(model, prompt, cfg, ["none", "suffix"], gen=gen, reference=plain,
                                              label=f"{which} {label} full masks")
            finally:
                speculative.LAZY_MASKS = True
        drafters = ["suffix", "mtp"] + [exactness.Adversarial(r) for r in (0, 2, None)]
        st_ = exactness.assert_equals_plain(model, prompt, cfg, drafters, gen=gen, reference=plain,
                                            label=f"{which} {label}")
        drafted += exactness.drafted(st_)
    assert drafted > 0


def test_steering_changes_the_output(model, sessions):
    """The processors act (a test of exactness that passes with processors doing nothing would be void)."""
    prompt = model.tokenizer.encode(SYS_PROMPT)
    base = GenerationConfig(max_tokens=24, draft="none", temperature=0.0)
    plain = model.tokenizer.decode(_gen(model, sessions, prompt, base))
    assert "import sys" in plain
    for which, steer in _configs(model).items():
        text = model.tokenizer.decode(_gen(model, sessions, prompt, base.replace(**steer)), skip_special=True)
        assert text != plain, which
        if which in ("phrases", "all"):
            assert "import sys" not in text
        if which == "json":
            json.loads(text)


# --- the phrase automaton against a brute-force matcher -------------------------------------------------

BND = -1


def _symbols(seq, flags):
    out = []
    for k, t in enumerate(seq):
        bnd = flags[t] & STARTS_WORD if k == 0 else flags[seq[k - 1]] & ENDS_BOUNDARY
        if bnd:
            out.append(BND)
        out.append(t)
    return out


def _value(strength, k, L):
    f32 = np.float32
    if k + 1 == L:
        return INF if math.isinf(strength) else float(f32(strength))
    a = f32(4.0) if math.isinf(strength) else f32(strength)  # PhraseAutomaton.BAN_RAMP
    return float(a * f32(k) / f32(L - 1))


def _brute_penalties(stream_syms, boundary, patterns, strengths, flags, V):
    """{token: penalty} by the definition: every pattern prefix ending with t that the stream + t ends with."""
    base = stream_syms + ([BND] if boundary else [])
    out = {}
    for p, s in zip(patterns, strengths):
        syms = _symbols(p, flags)
        tok_at = [j for j, x in enumerate(syms) if x != BND]
        for k, j in enumerate(tok_at):
            pre = syms[:j]
            if len(base) >= len(pre) and (not pre or base[len(base) - len(pre):] == pre):
                v = _value(s, k, len(p))
                if v > 0:
                    t = syms[j]
                    out[t] = max(out.get(t, 0.0), v)
    return out


@st.composite
def _phrase_case(draw):
    V = draw(st.integers(4, 10))
    flags = [EOG, NEWLINE | ENDS_BOUNDARY] + [draw(st.sampled_from([0, 1, 8, 9])) for _ in range(V - 2)]
    word = st.integers(2, V - 1)
    pats = draw(st.lists(st.lists(word, min_size=1, max_size=4), min_size=1, max_size=6))
    strengths = draw(st.lists(st.sampled_from([0.5, 1.0, 2.5, 7.0, INF]), min_size=len(pats), max_size=len(pats)))
    stream = draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=30))
    return V, flags, pats, strengths, stream


@settings(max_examples=300, deadline=None)
@given(_phrase_case())
def test_automaton_matches_brute_force(case):
    V, flags, pats, strengths, stream = case
    # duplicate token sequences keep their largest strength (phrases.patterns() does the same)
    best = {}
    for p, s in zip(pats, strengths):
        best[tuple(p)] = max(best.get(tuple(p), 0.0), s)
    pats, strengths = [list(p) for p in best], list(best.values())
    a = _core.PhraseAutomaton(pats, strengths, np.asarray(flags, dtype=np.uint8))
    state, syms, boundary = (0, 1), [], True
    for t in [None] + stream:
        if t is not None:
            state = a.step(state, t)
            if flags[t] & (NEWLINE | EOG):
                syms, boundary = [], True
            else:
                if boundary:
                    syms.append(BND)
                syms.append(t)
                boundary = bool(flags[t] & ENDS_BOUNDARY)
            assert state[1] == int(boundary)
        ids, pen = a.penalties(state)
        got = dict(zip(ids.tolist(), pen.tolist()))
        assert len(got) == len(ids)  # distinct
        assert got == _brute_penalties(syms, boundary, pats, strengths, flags, V)


def test_automaton_bad_input(model):
    flags = token_flags(model.tokenizer, model.n_vocab)
    nl = model.tokenizer.encode("\n")[0]
    with pytest.raises(ValueError, match="pattern 1 token 99999 is outside the vocabulary"):
        _core.PhraseAutomaton([[5], [99999]], [1.0, 1.0], flags)
    with pytest.raises(ValueError, match="pattern 0 token .* newline"):
        _core.PhraseAutomaton([[5, nl]], [1.0], flags)
    with pytest.raises(ValueError, match="strength -1"):
        _core.PhraseAutomaton([[5]], [-1.0], flags)
    with pytest.raises(ValueError, match="pattern 0 is empty"):
        _core.PhraseAutomaton([[]], [1.0], flags)


def test_phrase_variants_cover_case_and_space(model):
    a = automaton(model, [("Import sys", INF)])
    tok = model.tokenizer
    for text in ("import sys", "Import sys", "IMPORT SYS", "x = 1; import sys"):
        ids = tok.encode(text)
        s = (0, 1)
        for t in ids[:-1]:
            s = a.step(s, t)
        got = dict(zip(*(x.tolist() for x in a.penalties(s))))
        assert got.get(ids[-1]) == INF, text
    # a word inside another word is not the phrase: "reimport sys" leaves " sys" alone
    ids = tok.encode("reimport sys")
    s = (0, 1)
    for t in ids[:-1]:
        s = a.step(s, t)
    assert ids[-1] not in a.penalties(s)[0].tolist()


# --- the row finish against a numpy reference; the mask kernels against their twins ---------------------

def test_row_finish_matches_numpy(model):
    """Session.sample with bias + phrase penalties + masks == numpy: edit, mask, then argmax / pick_token."""
    rng = np.random.default_rng(5)
    tok = model.tokenizer
    V, W = model.n_vocab, (model.n_vocab + 31) // 32
    sparse = automaton(model, [("import sys", INF), ("from typing import", 3.0), ("os.path", 5.0)])
    # many single-token phrases: the static part of the penalties is applied densely
    words = [w for w in (tok.decode([i]).strip() for i in range(V)) if w.isalpha() and len(w) > 3][:400]
    dense = automaton(model, [("import sys", INF), ("from typing import", 3.0)] +
                      [(w, INF if i % 7 == 0 else 1.0 + i % 5) for i, w in enumerate(words)])
    assert dense.dense and not sparse.dense
    for a in (sparse, dense):
        _check_row_finish(model, a, rng)


def _check_row_finish(model, a, rng):
    tok = model.tokenizer
    V, W = model.n_vocab, (model.n_vocab + 31) // 32
    bias_ids = sorted({_tok(model, "import"), _tok(model, " sys"), int(rng.integers(0, V))})
    bias_vals = [-2.0, -INF, 1.25][:len(bias_ids)]
    steer = _core.Steering(V, bias_ids, bias_vals, a)
    prompt = tok.encode("import os\nfrom typing import List\nimport")
    inputs = tok.encode(" sys\nfrom typing import os.path")[:12]
    for temperature in (0.0, 0.8):
        for masked in (False, True):
            s = model.session(n_ctx=128, max_window=16)
            s.run(prompt)
            s.commit(len(prompt))
            s._core.set_steering(steer, 3)
            logits = s.run(inputs)
            masks = None
            if masked:
                masks = rng.integers(0, 2**32, size=(len(inputs), W), dtype=np.uint32)
                masks[:, :] |= np.uint32(0x0F0F0F0F)  # never empty
            p = sampling_params(GenerationConfig(temperature=temperature, seed=9))
            got = s._core.sample(p, masks).tolist()
            state = s._core.steer_state
            for i, t_in in enumerate(inputs):
                state = a.step(state, t_in)
                row = logits[i].copy()
                for b, v in zip(bias_ids, bias_vals):
                    row[b] = row[b] + np.float32(v)
                ids, pen = a.penalties(state)
                for t, pn in zip(ids.tolist(), pen.tolist()):
                    row[t] = -np.inf if math.isinf(pn) else row[t] - np.float32(pn)
                if masks is not None:
                    bits = np.unpackbits(masks[i].view(np.uint8), bitorder="little")[:V]
                    row[bits == 0] = -np.inf
                pos = len(prompt) + i + 1
                want = int(np.argmax(row)) if temperature == 0 else _core.pick_token(row, p, pos)
                assert got[i] == want, (temperature, masked, i)
            s.commit(1)


def test_mask_kernels_match_twins():
    rng = np.random.default_rng(3)
    for V in (1, 31, 32, 33, 100, 1000, 8192):
        for _ in range(20):
            W = (V + 31) // 32
            row = rng.standard_normal(V).astype(np.float32)
            row[rng.random(V) < 0.05] = np.nan
            row[rng.random(V) < 0.05] = -np.inf
            row[rng.random(V) < 0.3] = np.float32(1.5)  # ties
            kind = rng.integers(0, 4)
            if kind == 0:
                mask = rng.integers(0, 2**32, size=W, dtype=np.uint32)
            elif kind == 1:
                mask = np.full(W, 0xFFFFFFFF, dtype=np.uint32)
                mask[rng.integers(0, W)] = 0
            elif kind == 2:
                mask = np.zeros(W, dtype=np.uint32)
                mask[rng.integers(0, W)] = np.uint32(1) << np.uint32(rng.integers(0, 32))
            else:
                mask = np.zeros(W, dtype=np.uint32)
            np.testing.assert_array_equal(_core.apply_token_mask(row, mask), _core.apply_token_mask(row, mask, ref=True))
            assert _core.masked_argmax(row, mask) == _core.masked_argmax(row, mask, ref=True)
            sub = np.where(rng.random(V) < 0.3, rng.random(V) * 3, 0).astype(np.float32)
            sub[rng.random(V) < 0.05] = np.inf
            assert _core.masked_argmax_sub(row, sub, mask) == _core.masked_argmax_sub(row, sub, mask, ref=True)
    with pytest.raises(ValueError, match="mask for 100 tokens has 4 words, got 3"):
        _core.masked_argmax(np.zeros(100, np.float32), np.zeros(3, np.uint32))


def test_everything_banned_falls_back(model, sessions):
    """A grammar that only allows banned tokens, and a bias banning every token: no hang, no error."""
    prompt = model.tokenizer.encode(PROMPT)
    cfg = GenerationConfig(max_tokens=8, draft="none", regex="import sys", ban_phrases=[("import sys", INF)])
    assert model.tokenizer.decode(_gen(model, sessions, prompt, cfg), skip_special=True) == "import sys"
    all_banned = {t: -INF for t in range(model.n_vocab)}
    out = _gen(model, sessions, prompt, GenerationConfig(max_tokens=4, draft="none", logit_bias=all_banned))
    plain = _gen(model, sessions, prompt, GenerationConfig(max_tokens=4, draft="none"))
    assert out == plain  # every token banned = no token banned


def test_bad_steering_options(model, sessions):
    prompt = model.tokenizer.encode(PROMPT)
    with pytest.raises(ValueError, match="logit_bias.*outside the vocabulary"):
        _gen(model, sessions, prompt, GenerationConfig(max_tokens=2, logit_bias={10**6: 1.0}))
    with pytest.raises(ValueError, match="bad option regex"):
        _gen(model, sessions, prompt, GenerationConfig(max_tokens=2, regex="[0-9"))
    with pytest.raises(ValueError, match="bad option grammar"):
        _gen(model, sessions, prompt, GenerationConfig(max_tokens=2, grammar="start: nothing_defined"))
    for kw, msg in ((dict(stop=[""]), "stop"), (dict(logit_bias={3: math.nan}), "logit_bias"),
                    (dict(ban_phrases=[("a\nb", 1.0)]), "spans lines"), (dict(ban_phrases=[("x", 0)]), "strength"),
                    (dict(regex="a", grammar="start: \"a\""), "one output constraint"),
                    (dict(json_schema="{}"), "json_schema")):
        with pytest.raises(ValueError, match=msg):
            GenerationConfig(**kw).validate()


# --- bans hold over 200 samples; JSON schemas validate ---------------------------------------------------

def _sample_texts(model, cfg, n, prompt):
    """n sampled generations (seeds 0..n-1) from one prefilled checkpoint."""
    s = model.session(n_ctx=64, max_window=16)
    ids = model.tokenizer.encode(prompt)
    prefill(s, ids[:-1])
    cp = s.checkpoint()
    steer = Steering(model, cfg)
    texts = []
    for seed in range(n):
        s.restore(cp)
        c = cfg.replace(seed=seed)
        out = list(decode(s, ids[-1], c, set(model.tokenizer.eog_ids), LoopStats(), steering=steer))
        texts.append(model.tokenizer.decode(out, skip_special=True))
    return texts


def test_banned_phrases_never_appear_in_200_samples(model):
    cfg = GenerationConfig(max_tokens=6, temperature=1.0, draft="none")
    phrases = ("import sys", "from typing import")
    free = _sample_texts(model, cfg, 200, PROMPT)
    for ph in phrases:
        assert sum(ph in t for t in free) >= 10, ph  # the model does produce them
    banned = _sample_texts(model, cfg.replace(ban_phrases=[(p, INF) for p in phrases]), 200, PROMPT)
    for ph in phrases:
        assert not any(ph in t for t in banned), ph


SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10},
        "owner": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                   "admin": {"type": "boolean"}},
                  "required": ["id", "admin"], "additionalProperties": False}},
        "required": ["name", "owner"], "additionalProperties": False},
    "array_enum": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"enum": ["os", "sys", "json"]}, "minItems": 1, "maxItems": 3},
        "mode": {"enum": ["r", "w", "a"]}}, "required": ["tags", "mode"], "additionalProperties": False},
    "numbers_pattern": {"type": "object", "properties": {
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "version": {"type": "string", "pattern": "^[0-9]\\.[0-9]{1,2}$"},
        "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
        "required": ["ratio", "version", "items"], "additionalProperties": False},
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_outputs_validate(model, sessions, name):
    schema = SCHEMAS[name]
    prompt = model.tokenizer.encode("config = ")
    for opts in ({}, dict(temperature=0.8, seed=1), dict(temperature=1.0, seed=2)):
        cfg = GenerationConfig(max_tokens=120, json_schema=schema, **opts)
        st_ = LoopStats()
        out = _gen(model, sessions, prompt, cfg, stats=st_)
        assert st_.stop == "eog", (name, opts, model.tokenizer.decode(out))
        doc = json.loads(model.tokenizer.decode(out, skip_special=True))
        jsonschema.validate(doc, schema)


# --- checkpoints: a steered generation resumes exactly --------------------------------------------------

@pytest.mark.parametrize("kind", ["memory", "file"])
def test_checkpoint_resume_equals_uninterrupted(model, tmp_path, kind):
    tok = model.tokenizer
    eog = set(tok.eog_ids)
    phrases = [("import sys", INF), ("from typing import", 3.0), ("import re", 2.0)]
    regex = r"((import|from) [a-z_.]+( import [a-zA-Z_, ]+)?\n){1,8}"
    cfg = GenerationConfig(max_tokens=40, temperature=0.9, seed=4, ban_phrases=phrases, regex=regex,
                           draft="suffix", dry_multiplier=1.0)
    ids = tok.encode(PROMPT)
    ref = model.session(n_ctx=256, max_window=16)
    prefill(ref, ids[:-1])
    full = list(decode(ref, ids[-1], cfg, eog, LoopStats(), make_proposer(model, cfg)))
    assert len(full) > 20
    N = 13
    s = model.session(n_ctx=256, max_window=16)
    prefill(s, ids[:-1])
    first = list(decode(s, ids[-1], cfg.replace(max_tokens=N), eog, LoopStats(), make_proposer(model, cfg)))
    assert first == full[:N]
    cp = s.checkpoint()
    assert cp.steer_origin == len(ids) and s.position == len(ids) + N - 1
    if kind == "file":
        s.save(tmp_path / "cp.bin")
    # another conversation on the same session, with other processors
    s.reset()
    other = tok.encode("def main(")
    prefill(s, other[:-1])
    list(decode(s, other[-1], GenerationConfig(max_tokens=9, ban_phrases=[("self", 2.0)], json_schema={"type": "object"}),
                eog, LoopStats()))
    if kind == "file":
        s = model.load_session(tmp_path / "cp.bin", n_ctx=256, max_window=16)
    else:
        s.restore(cp)
    assert s.steer_origin == len(ids)
    rest = list(decode(s, first[-1], cfg.replace(max_tokens=len(full) - N), eog, LoopStats(),
                       make_proposer(model, cfg), origin=s.steer_origin))
    assert first + rest == full


def test_restore_rescans_phrase_state(model):
    """C++ alone: restore() rebuilds the phrase state from the restored tokens, whatever ran in between."""
    a = automaton(model, [("import sys", INF), ("from typing import", 3.0)])
    steer = _core.Steering(model.n_vocab, [], [], a)
    tok = model.tokenizer
    s = model.session(n_ctx=128)
    ids = tok.encode("import os\nfrom typing")
    s.run(ids[:3])
    s.commit(3)
    s._core.set_steering(steer, 2)
    for t in ids[3:]:
        s.run([t])
        s.commit(1)
    want = s._core.steer_state
    assert want != (0, 1)
    cp = s.checkpoint()
    for t in tok.encode(" import os\nimport"):
        s.run([t])
        s.commit(1)
    assert s._core.steer_state != want
    s.restore(cp)
    assert s._core.steer_state == want


# --- stop strings ---------------------------------------------------------------------------------------

def test_stop_strings_across_tokens_streamed(model, sessions):
    tok = model.tokenizer
    prompt = tok.encode(SYS_PROMPT)
    plain_ids = _gen(model, sessions, prompt, GenerationConfig(max_tokens=40, draft="none", temperature=0.0))
    plain = tok.decode(plain_ids, skip_special=True)
    # a stop string spanning three tokens (" sys", "\n", "import"), first seen after the output's start
    stop = "sys\nimp"
    assert stop in plain
    pieces_ids = [tok.token_bytes(t) for t in plain_ids]
    assert not any(stop.encode() in p for p in pieces_ids)
    want = plain[:plain.index(stop)]
    for draft in ("none", "suffix", "mtp"):
        cfg = GenerationConfig(max_tokens=40, draft=draft, stop=[stop, "never-there"], temperature=0.0)
        st_ = LoopStats()
        out = _gen(model, sessions, prompt, cfg, stats=st_)
        assert st_.stop == "stop"
        # the decode loop ends on the token completing the stop string
        assert tok.decode(out, skip_special=True).startswith(want + stop[:1])
        # the stream: pieces never show bytes that could still start a stop string, and stop before it
        ts = TextStream(tok, cfg.stop)
        shown, produced = "", ""
        for t in out:
            shown += ts.push(t)
            produced += tok.decode([t])
            if ts.stopped:
                break
            held = produced[len(shown):]
            assert produced.startswith(shown)
            longest = max((n for s_ in cfg.stop for n in range(len(s_)) if produced.endswith(s_[:n])), default=0)
            assert len(held) == longest
        shown += ts.flush()
        assert ts.stopped and shown == want


def test_text_stream_holds_and_flushes(model):
    tok = model.tokenizer
    ids = tok.encode("import sys\nimport os\n")
    ts = TextStream(tok, ["import os\nx"])
    text = "".join(ts.push(t) for t in ids)
    assert text == "import sys\n" and not ts.stopped  # "import os\n" could still become the stop string
    assert ts.flush() == "import os\n"


# --- the command line, as a user runs it ----------------------------------------------------------------

def test_cli_steering_options(model, tmp_path):
    import subprocess
    import sys

    cli = [sys.executable, "-m", "strata_py.generate", "--threads", "2", "--json"]
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMAS["array_enum"]))
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("# mine\n\"tags\": [\"os\"\tinf\nsys\"]\t2.5\n")
    r = subprocess.run(cli + ["--json-schema", str(schema), "--ban-phrases", str(phrases), "--ban-phrases", "default",
                              "--stop", "json", "--logit-bias", f"{_tok(model, ' [')}=-1.5", "-n", "80", "config = "],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = json.loads(r.stdout)["text"]
    assert '"tags": ["os"' not in text and "json" not in text
    if json.loads(r.stdout)["stats"]["stop"] == "eog":
        jsonschema.validate(json.loads(text), SCHEMAS["array_enum"])
    bad = tmp_path / "bad.txt"
    bad.write_text("fine phrase\nbad one\tstrong\n")
    r = subprocess.run(cli + ["--ban-phrases", str(bad), "x"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "bad.txt:2: bad strength 'strong'" in r.stderr, r.stderr
    notjson = tmp_path / "s.json"
    notjson.write_text("{type: object}")
    r = subprocess.run(cli + ["--json-schema", str(notjson), "--logit-bias", "5", "x"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "--logit-bias '5'" in r.stderr, r.stderr
    r = subprocess.run(cli + ["--json-schema", str(notjson), "x"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "s.json: not JSON" in r.stderr, r.stderr


def test_complete_grammar_allows_only_end_of_generation(model, sessions):
    """After the grammar is complete and ended, only end-of-generation tokens follow (stop_at_eos=False)."""
    prompt = model.tokenizer.encode("x = ")
    cfg = exactness.config("greedy", 0, 10, regex="ab", stop_at_eos=False)
    gen = _gen_on(sessions)
    plain = exactness.plain(model, prompt, cfg, gen)
    assert len(plain) == 10 and model.tokenizer.decode(plain, skip_special=True) == "ab"
    assert all(t in model.tokenizer.eog_ids for t in plain[-5:])
    exactness.assert_equals_plain(model, prompt, cfg, [exactness.Adversarial(1)], gen=gen, reference=plain)
