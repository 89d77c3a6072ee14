"""Lazy grammar masks (issue 15): a row finished without a mask, then checked against the grammar through its
candidates (csrc/sampling/sampler.h PickTrace, GrammarMatcher.fix_rows), gives exactly the token of the row
finished under its full mask: greedy and sampled (min-p, top-k, top-p, DRY, logit bias, phrases), for grammars
that refuse the row's best token, refuse some candidates, allow all, and at stopped states; windows == serial.
The checks can fail: a mask that drops one allowed candidate's bit changes some rows' tokens."""
from __future__ import annotations

import math

import numpy as np
import pytest

from strata_py import _core, speculative
from strata_py.config import GenerationConfig
from strata_py.model import Model, sampling_params
from strata_py.speculative import accept, prefill
from strata_py.steering import Steering
from strata_py.steering.grammar import GrammarMatcher, grammar_text
import exactness
from seeds import fresh_rng

CAP = speculative.LAZY_CAP
OVER, CHECK, COMPLETE = 0, 1, 2  # PickTrace kinds
CODE = "import os\n"
RECORDS = 'FIELDS = [{"id": 0, "name": "a", "kind": "int"}, {"id": 1, "name": "b", "kind": "str"}]\n\nCOLUMNS = '
# (prompt, grammar options, stop_at_eos): a schema the code prompt fights (its best token is often refused), one
# it follows (some candidates refused), a grammar that allows every token, and one that completes early (then
# only end-of-generation tokens are allowed: the stopped state)
GRAMMARS = {
    "json_vs_code": (CODE, dict(json_schema={"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"], "additionalProperties": False}), True),
    "json_records": (RECORDS, dict(json_schema={"type": "array", "maxItems": 4, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 8},
                                         "kind": {"enum": ["int", "str", "bool"]}},
        "required": ["id", "name", "kind"], "additionalProperties": False}}), True),
    "allow_all": (CODE, dict(regex=r"[\s\S]*"), False),
    "stopped": (CODE, dict(regex=r"(import|from) (os|sys)"), False),
}


@pytest.fixture(scope="module")
def model():
    return Model.load(threads=2)


def _bit(mask, t):
    return (int(mask[t >> 5]) >> (t & 31)) & 1


def _lazy_choice(out, kind, ids, allowed, repick):
    """fix_rows' decision for one row from its trace, with allowed(t) the mask: the token, or None = full mask."""
    if ids is None or not allowed(ids[0]):
        return None
    bits = [allowed(t) for t in ids]
    if all(bits):
        return out
    return repick(bytes(bits)) if kind == COMPLETE else None


# --- the sampler alone: random rows and masks -----------------------------------------------------------

def _random_params(rng, greedy_share=0.15):
    temperature = 0.0 if rng.random() < greedy_share else float(rng.choice([0.3, 0.7, 1.0, 1.5, 3.0]))
    return _core.SamplingParams(temperature=temperature, min_p=float(rng.choice([0.0, 0.01, 0.05, 0.2])),
                                top_k=int(rng.choice([0, 0, 2, 5, 40, 3000])), top_p=float(rng.choice([1.0, 1.0, 0.9])),
                                seed=int(rng.integers(1 << 62)))


def _random_row(rng, V):
    row = (rng.standard_normal(V) * rng.choice([0.5, 2.0, 5.0, 9.0])).astype(np.float32)
    if rng.random() < 0.3:  # ties at the top and near it
        row[rng.integers(0, V, 20)] = row.max()
        row[rng.integers(0, V, 20)] = np.nextafter(row.max(), -np.inf)
    if rng.random() < 0.2:
        row[rng.random(V) < 0.02] = np.nan
        row[rng.random(V) < 0.02] = -np.inf
    return row


def test_trace_decides_like_the_full_mask():
    """pick_token's trace: the lazy decision (stands / repick / full mask) equals pick_token on the masked row, and
    so does a sparse mask holding only the candidates' bits (complete traces); dropping one allowed candidate's
    bit changes the token for some rows (the comparison is not vacuous)."""
    rng = fresh_rng()
    seen = {}
    dropped_differs = sparse_dropped_differs = 0
    for case in range(3000):
        V = int(rng.choice([40, 1000, 5000]))
        row, p, pos = _random_row(rng, V), _random_params(rng), int(rng.integers(0, 1 << 20))
        if not (row > -np.inf).any():
            continue
        t, kind, ids, _ = _core.pick_traced(row, p, pos, CAP)
        assert t == _core.pick_token(row, p, pos)
        g = _core.pick_token(row, _core.SamplingParams(temperature=0.0), pos)
        if kind != OVER:  # the first in the sampler's order: the largest scaled logit (ties by id, after scaling)
            T = np.float32(p.temperature)
            assert ids[0] == g if p.temperature == 0 else row[ids[0]] / T == row[g] / T
        allowed = rng.random(V) < float(rng.choice([0.05, 0.5, 0.9, 1.0]))
        if ids and rng.random() < 0.7:
            allowed[ids[0]] = True
        if kind != OVER and rng.random() < 0.2:  # every candidate allowed
            allowed[ids] = True
        masked = np.where(allowed, row, np.float32(-np.inf)).astype(np.float32)
        if not (masked > -np.inf).any():
            continue
        full = _core.pick_token(masked, p, pos)

        def repick(bits):
            return _core.pick_traced(row, p, pos, CAP, bits)[3]

        lazy = _lazy_choice(t, kind, ids if kind != OVER else None, lambda x: bool(allowed[x]), repick)
        how = "full" if lazy is None else "stands" if lazy == t and all(allowed[ids]) else "repick"
        seen[(kind, how)] = seen.get((kind, how), 0) + 1
        if lazy is not None:
            assert lazy == full, (case, p, kind, how)
        if kind == COMPLETE and allowed[ids[0]]:
            sparse = np.full(V, -np.inf, np.float32)
            sparse[ids] = np.where(allowed[ids], row[ids], np.float32(-np.inf))
            assert _core.pick_token(sparse, p, pos) == full, (case, p)
            on = [j for j in range(1, len(ids)) if allowed[ids[j]]]
            if on:  # drop the bit of the best allowed candidate after the top
                bits = [bool(allowed[x]) for x in ids]
                bits[on[0]] = False
                dropped_differs += repick(bytes(bits)) != full
                sparse[ids[on[0]]] = -np.inf
                sparse_dropped_differs += _core.pick_token(sparse, p, pos) != full
    for key in [(CHECK, "stands"), (CHECK, "full"), (COMPLETE, "stands"), (COMPLETE, "repick"), (COMPLETE, "full"),
                (OVER, "full")]:
        assert seen.get(key, 0) > 10, (key, seen)
    assert dropped_differs > 10 and sparse_dropped_differs > 10, (dropped_differs, sparse_dropped_differs)


def test_repick_refuses_what_it_cannot_decide():
    rng = fresh_rng()
    row = (rng.standard_normal(500) * 8).astype(np.float32)
    p = _core.SamplingParams(temperature=1.0, min_p=0.05, seed=1)
    t, kind, ids, _ = _core.pick_traced(row, p, 3, CAP)
    assert kind == COMPLETE
    with pytest.raises(ValueError, match="refuses the row's best token"):
        _core.pick_traced(row, p, 3, CAP, bytes([0] * len(ids)))
    with pytest.raises(ValueError, match="allowed flags for"):
        _core.pick_traced(row, p, 3, CAP, bytes([1] * (len(ids) + 1)))
    assert _core.pick_traced(row, _core.SamplingParams(temperature=1.0, seed=1), 3, CAP)[1] == OVER  # no min-p
    with pytest.raises(ValueError, match="not complete"):
        _core.pick_traced(row, _core.SamplingParams(temperature=0.0), 3, CAP, b"\x01")


# --- the default model: real rows, real grammars --------------------------------------------------------

MODES = ["greedy", "min_p", "top_k_min_p", "top_k", "top_p"]


def _random_config(model, rng, grammar: str, max_tokens: int, mode: str) -> GenerationConfig:
    _, g, stop_at_eos = GRAMMARS[grammar]
    opts = dict(temperature=0.0 if mode == "greedy" else float(rng.choice([0.7, 1.0, 1.5])),
                min_p=0.0 if mode in ("greedy", "top_k") else float(rng.choice([0.02, 0.05, 0.1])),
                top_k=int(rng.choice([3, 8, 12])) if mode in ("top_k_min_p", "top_k") else 0,
                top_p=0.9 if mode == "top_p" else 1.0,
                dry_multiplier=float(rng.choice([0.0, 0.8])))
    if rng.random() < 0.5:  # logit bias on tokens the grammars care about, and a random one
        ids = {t for w in ['"', ' "', "{", "import", " sys", "0"] for t in model.tokenizer.encode(w)[:1]}
        ids.add(int(rng.integers(model.n_vocab)))
        opts["logit_bias"] = {t: float(rng.choice([-3.0, 2.0, -math.inf])) for t in sorted(ids)}
    if rng.random() < 0.5:
        opts["ban_phrases"] = [('"name"', 2.0), ("import sys", math.inf), ("field", 3.0)]
    return exactness.config("greedy", int(rng.integers(1 << 31)), max_tokens, stop_at_eos=stop_at_eos, **opts, **g)


def _walk_windows(model, prompt, cfg, path, rng, tally):
    """Windows of 1-16 rows along plain decoding's path (drafts right for a while, then one wrong): every row the
    acceptance walk reaches gets the same token lazily (fix_rows) as under its full mask (Session.sample)."""
    eog = set(model.tokenizer.eog_ids)
    s = model.session(n_ctx=256, max_window=16)
    prefill(s, prompt[:-1])
    core, params, origin = s._core, sampling_params(cfg), s.position + 1
    steer = Steering(model, cfg, 16)
    steer.attach(s, origin)
    full_g = steer.grammar
    lazy_g = GrammarMatcher(model, *grammar_text(cfg), 16)
    lazy_g.sync(s.tokens, origin)
    root, done = prompt[-1], 0
    while done < len(path) and s.position + 16 < s.n_ctx:
        T = min(int(rng.integers(1, 17)), len(path) - done)
        drafts = list(path[done:done + T - 1])
        if drafts and rng.random() < 0.5:
            j = int(rng.integers(len(drafts)))
            drafts[j] = (drafts[j] + 1) % model.n_vocab
        inputs, pos0 = [root] + drafts, s.position
        out, cands, complete = core.run_sample_traced(np.asarray(inputs, dtype=np.int32), params, CAP)
        masks = full_g.window_masks(inputs, pos0)
        full = core.sample(params, masks).tolist()
        lazy = lazy_g.fix_rows(inputs, pos0, list(out), cands, complete,
                               lambda i, mk: core.sample_row(params, i, mk), core.repick)
        walked = lazy_g._pending_out[1]
        assert lazy[:walked] == full[:walked], (cfg, pos0, inputs, lazy, full)
        keep = accept(inputs, full, eog)
        assert keep <= walked and accept(inputs, lazy, eog) == keep
        for i in range(walked):
            ids, mask = cands[i], masks[i]
            if ids is None:
                tally["over"] += 1
            elif (mask == lazy_g._eog_mask).all():
                tally["stopped"] += 1
            elif not _bit(mask, ids[0]):
                tally["best refused"] += 1
            else:
                tally["all allowed" if all(_bit(mask, t) for t in ids) else "some refused"] += 1
                if complete[i]:  # the candidates' bits decide; without one allowed candidate's bit, some rows differ
                    bits = [_bit(mask, t) for t in ids]
                    assert core.repick(i, bytes(bits)) == full[i]
                    on = [j for j in range(1, len(ids)) if bits[j]]
                    if on:  # drop the chosen token's bit if it is not the best one, else the next candidate's
                        bits[ids.index(full[i]) if full[i] in ids[1:] else on[0]] = 0
                        tally["dropped bit differs"] += core.repick(i, bytes(bits)) != full[i]
        core.commit(keep)
        full_g.commit(keep)
        lazy_g.commit(keep)
        assert full[:keep] == path[done:done + keep], "full-mask windows differ from plain decoding"
        done += keep
        root = full[keep - 1]
        if root in eog and cfg.stop_at_eos:
            break


def test_lazy_rows_equal_full_masks(model):
    """Row by row on the default model, for random samplers, biases, phrases and DRY over the four grammars: every
    kind of row occurs (stopped, best token refused, some candidates refused, all allowed), and a mask without one
    allowed candidate's bit changes some rows' tokens."""
    rng = fresh_rng()
    tally = {k: 0 for k in ("over", "stopped", "best refused", "some refused", "all allowed", "dropped bit differs")}
    gen = lambda m, p, c, proposer, stats: exactness._generate_ids(m, p, c, proposer, stats)
    for case in range(16):
        grammar = list(GRAMMARS)[case % len(GRAMMARS)]
        prompt = model.tokenizer.encode(GRAMMARS[grammar][0])
        cfg = _random_config(model, rng, grammar, int(rng.integers(16, 40)), MODES[case % len(MODES)])
        speculative.LAZY_MASKS = False
        try:
            path = exactness.plain(model, prompt, cfg, gen)
        finally:
            speculative.LAZY_MASKS = True
        _walk_windows(model, prompt, cfg, path, rng, tally)
    for k in ("stopped", "best refused", "some refused", "all allowed"):
        assert tally[k] > 0, str(tally)
    assert tally["dropped bit differs"] > 0, str(tally)


@pytest.mark.parametrize("grammar", list(GRAMMARS))
def test_lazy_decoding_equals_full_masks(model, grammar):
    """decode() with lazy masks == with full masks, plain and in windows (suffix and adversarial drafts)."""
    rng = fresh_rng()
    prompt = model.tokenizer.encode(GRAMMARS[grammar][0])
    for mode in rng.choice(MODES, 2, replace=False):
        cfg = _random_config(model, rng, grammar, 32, str(mode))
        speculative.LAZY_MASKS = False
        try:
            ref = exactness.plain(model, prompt, cfg)
        finally:
            speculative.LAZY_MASKS = True
        assert ref
        exactness.assert_equals_plain(model, prompt, cfg, ["none", "suffix"] +
                                      [exactness.Adversarial(r) for r in (0, 2, None)],
                                      reference=ref, label=f"{grammar} {cfg}")


def test_validate_is_the_mask_where_no_token_is_forced(model):
    """fix_rows reads a token's mask bit as in llguidance's mask: the first forced token alone where
    compute_ff_tokens gives one, else validate_tokens([t]), both where the grammar forces no bytes and where its
    forced bytes make no token (their tokenization's tail could merge with what follows). Checked for every token
    of the vocabulary at real states (along JSON and regex outputs; accepting ones among them; the calls in
    fix_rows' order). Where tokens are forced, the mask and validate_tokens differ (the mask keeps the canonical
    tokenization only), so the first case is needed and the comparison can fail."""
    rng = fresh_rng()
    V = model.n_vocab
    tally = {"unforced": 0, "accepting": 0, "forced, one token": 0, "forced, differ": 0, "forced, no token": 0}
    imports = (CODE, dict(regex=r"((import|from) [a-z_.]+( import [a-zA-Z_, ]+)?\n){1,4}"), True)  # accepting at each line end
    bench = ("FIELDS = []\n\nCOLUMNS = ", dict(json_schema={"type": "array", "minItems": 3, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "kind": {"enum": ["int", "str"]}},
        "required": ["id", "kind"], "additionalProperties": False}}), True)  # '"' forced before the enum: no token
    for grammar, (prompt, g, _) in [*((k, GRAMMARS[k]) for k in ("json_records", "json_vs_code")), ("imports", imports),
                                    ("enum", bench)]:
        mode = "greedy" if grammar in ("imports", "enum") else "sampled"  # greedy: line ends (accepting states) for sure
        cfg = exactness.config(mode, int(rng.integers(1 << 31)), 40, **g)
        out = exactness.plain(model, model.tokenizer.encode(prompt), cfg)
        gm = GrammarMatcher(model, *grammar_text(cfg), 16)
        gm.sync([], 0)
        m, row = gm.matcher, np.empty(gm.words, np.uint32)
        seen = {"unforced": 0, "one token": 0, "no token": 0, "accepting": 0}
        for t in out:
            if m.is_stopped():
                break
            ff = m.compute_ff_tokens()  # as fix_rows asks: first
            forced, acc = bool(m.compute_ff_bytes()), m.is_accepting()
            kind = "one token" if ff else "no token" if forced else "unforced"
            if seen[kind] < 3 or (acc and not seen["accepting"]):
                seen[kind] += 1
                m.unsafe_compute_mask_ptr(row.ctypes.data, gm.words * 4)
                bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:V].astype(bool)
                valid = np.array([m.validate_tokens([x]) == 1 for x in range(V)])
                if ff:
                    tally["forced, one token"] += 1
                    tally["forced, differ"] += bool((valid != bits).any())
                    assert bits[ff[0]] and bits.sum() == 1, (grammar, ff)
                else:
                    tally["forced, no token" if forced else "unforced"] += 1
                    tally["accepting"] += acc
                    seen["accepting"] += acc
                    assert (valid == bits).all(), (grammar, kind, np.nonzero(valid != bits)[0][:8])
            assert m.consume_token(t)
    assert tally["unforced"] >= 5 and tally["accepting"] >= 1 and tally["forced, differ"] >= 1, tally
    assert tally["forced, one token"] >= 1 and tally["forced, no token"] >= 1, tally


class _SpyCore:
    """A session's C++ core, recording the linger_us each window's run asked for."""

    def __init__(self, core):
        self._c, self.lingers = core, []

    def run_sample_traced(self, tokens, params, cap, linger_us=0.0):
        self.lingers.append(linger_us)
        return self._c.run_sample_traced(tokens, params, cap, linger_us)

    def run_sample(self, tokens, params, masks=None, linger_us=0.0, verified_prefix=False):
        self.lingers.append(linger_us)
        return self._c.run_sample(tokens, params, masks, linger_us, verified_prefix)

    def __getattr__(self, name):
        return getattr(self._c, name)


class _SpySession:
    def __init__(self, session):
        self._s, self._core = session, _SpyCore(session._core)

    def __getattr__(self, name):
        return getattr(self._s, name)


@pytest.mark.parametrize("lazy", [True, False])
def test_grammar_windows_keep_the_pool_polling(model, lazy):
    """Under a grammar every window's forward asks the pool to keep its workers polling through the grammar's step
    (speculative.GRAMMAR_LINGER_US: a worker asleep by the next forward cost it ~50 us), lazy or full masks; without
    a grammar no window does. The tokens are those of a session without the spy."""
    from strata_py.generate import generate_ids

    prompt = model.tokenizer.encode(GRAMMARS["json_records"][0])
    for grammar in (GRAMMARS["json_records"][1], {}):
        cfg = exactness.config("sampled", 3, 24, **grammar)
        want = exactness.plain(model, prompt, cfg)
        spy = _SpySession(model.session(n_ctx=512, max_window=cfg.max_window))
        speculative.LAZY_MASKS = lazy
        try:
            got = list(generate_ids(model, prompt, cfg, session=spy))
        finally:
            speculative.LAZY_MASKS = True
        assert got == want
        assert len(spy._core.lingers) == len(got)
        assert set(spy._core.lingers) == ({speculative.GRAMMAR_LINGER_US} if grammar else {0.0})
    assert speculative.GRAMMAR_LINGER_US > 0
