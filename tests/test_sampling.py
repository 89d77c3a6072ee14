"""Sampler (csrc/sampling) against a numpy reference of the same semantics (engine spec section 5).

The reference below restates sampler.cpp's contract in numpy: penalties in float32 in llama.cpp's order,
then temperature -> tail cut (w < 1e-12 of the max) -> top-k -> top-p -> min-p in one total order
(scaled logit descending, ties by lower id), weights and sums in float64, inverse CDF with the
position-keyed uniform. The C++ picks must equal the reference's on fresh random logits.
"""
from __future__ import annotations

import numpy as np
import pytest

from strata_py import _core

M64 = (1 << 64) - 1
EMPTY = np.zeros(0, np.int32)


# ---------------------------------------------------------------- numpy reference
def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniform_ref(seed: int, pos: int) -> float:
    return (splitmix64(seed ^ splitmix64(pos & M64)) >> 11) * 2.0**-53


def penalties_ref(logits, p, hist) -> np.ndarray:
    out = np.array(logits, np.float32, copy=True)
    hist = np.asarray(hist, np.int64)
    rp, pres, freq = np.float32(p.repetition_penalty), np.float32(p.presence_penalty), np.float32(p.frequency_penalty)
    if p.penalty_last_n == 0 or (rp == 1 and pres == 0 and freq == 0) or len(hist) == 0:
        return out
    ids, counts = np.unique(hist[-p.penalty_last_n:], return_counts=True)
    for t, c in zip(ids, counts):
        if t < 0 or t >= len(out):
            continue
        x = out[t]
        if rp != 1:
            x = x / rp if x > 0 else x * rp
        out[t] = x - (np.float32(c) * freq + pres)
    return out


def kept_ref(logits, p):
    """(ids, weights) of the kept set in walk order, or (greedy id, None)."""
    x = np.asarray(logits, np.float32)
    ok = ~np.isnan(x) & (x > -np.inf)
    if not ok.any():
        raise RuntimeError("no finite logit")
    greedy = int(np.flatnonzero(x == x[ok].max())[0])
    if p.temperature == 0:
        return greedy, None
    s = x / np.float32(p.temperature)
    m = s[greedy]
    if np.isinf(m):
        return greedy, None
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.exp(s.astype(np.float64) - np.float64(m))
    ids = np.flatnonzero(w >= 1e-12)
    ids = ids[np.lexsort((ids, -s[ids]))]
    if p.top_k > 0:
        ids = ids[: p.top_k]
    w = w[ids]
    n = len(w)
    if p.top_p < 1:
        cum = np.cumsum(w)
        hit = np.flatnonzero(cum >= np.float64(np.float32(p.top_p)) * cum[-1])
        n = int(hit[0]) + 1 if len(hit) else n
    if p.min_p > 0:
        n = min(n, max(1, int(np.count_nonzero(w[:n] >= np.float64(np.float32(p.min_p))))))
    return ids[:n], w[:n]


def pick_ref(logits, p, pos) -> int:
    ids, w = kept_ref(logits, p)
    if w is None:
        return ids
    cum = np.cumsum(w)
    hit = np.flatnonzero(cum > uniform_ref(p.seed, pos) * cum[-1])
    return int(ids[hit[0]] if len(hit) else ids[-1])


def probs_ref(logits, p, V) -> np.ndarray:
    """The distribution pick_ref samples from, over the whole vocabulary."""
    ids, w = kept_ref(logits, p)
    out = np.zeros(V)
    out[ids] = w / w.sum()
    return out


# ---------------------------------------------------------------- helpers
def P(**kw):
    return _core.SamplingParams(**kw)


def rand_logits(rng, V, scale=3.0, ties=False):
    x = rng.standard_normal(V) * scale
    if ties:
        x = np.round(x * 2) / 2  # many exact ties: exercises the id tie-break
    return x.astype(np.float32)


CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=40),
    dict(temperature=0.8, top_p=0.9),
    dict(temperature=1.3, min_p=0.05),
    dict(temperature=0.6, top_k=20, top_p=0.8, min_p=0.02),
    dict(temperature=1.0, top_k=1),
    dict(temperature=2.5, top_p=0.5),
    dict(temperature=0.01),
]


# ---------------------------------------------------------------- rng
def test_uniform_matches_reference_and_is_uniform():
    for seed in (0, 1, 42, 2**63 + 5, M64):
        for pos in (0, 1, 7, 12345, 2**40, -1):
            assert _core.uniform_at(seed, pos) == uniform_ref(seed, pos)
    u = np.array([_core.uniform_at(9, i) for i in range(20000)])
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(hist - 2000) < 200)


# ---------------------------------------------------------------- penalties
@pytest.mark.parametrize("seed", range(4))
def test_penalties_match_reference(seed):
    rng = np.random.default_rng(seed)
    V = 1000
    logits = rand_logits(rng, V)
    hist = rng.integers(0, 60, size=200).astype(np.int32)  # many repeats
    hist[::17] = [-1, V, V + 5, 2**31 - 1, -(2**31), -7, V - 1, 0, 3, 5, 999, 1000][: len(hist[::17])]
    for kw in [
        dict(repetition_penalty=1.3),
        dict(presence_penalty=0.5, frequency_penalty=0.25),
        dict(repetition_penalty=0.8, presence_penalty=-0.4, frequency_penalty=0.1, penalty_last_n=37),
        dict(repetition_penalty=1.1, frequency_penalty=1.0, penalty_last_n=1000),
        dict(repetition_penalty=1.5, penalty_last_n=0),
        dict(),
    ]:
        p = P(**kw)
        before = logits.copy()
        got = _core.apply_penalties(logits, p, hist)
        assert np.array_equal(logits, before), "apply_penalties must not modify its input"
        assert got.dtype == np.float32 and got.shape == (V,)
        assert np.array_equal(got, penalties_ref(logits, p, hist)), kw
    # Only the window's tokens change.
    p = P(repetition_penalty=2.0, penalty_last_n=5)
    got = _core.apply_penalties(logits, p, hist)
    changed = set(np.flatnonzero(got != logits).tolist())
    assert changed <= set(int(t) for t in hist[-5:] if 0 <= t < V)
    assert np.array_equal(_core.apply_penalties(logits, p, EMPTY), logits)


# ---------------------------------------------------------------- picking vs the reference
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_pick_matches_reference(cfg, seed, ties):
    rng = np.random.default_rng(1000 + seed)
    V = 1000
    p = P(seed=seed * 7919 + 3, **cfg)
    for pos in rng.integers(0, 1 << 20, size=25):
        logits = rand_logits(rng, V, scale=rng.uniform(0.5, 6), ties=ties)
        before = logits.copy()
        assert _core.pick_token(logits, p, int(pos)) == pick_ref(logits, p, int(pos))
        assert np.array_equal(logits, before)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize(
    "cfg",
    [dict(temperature=0.8, top_p=0.95), dict(temperature=1.0, top_k=50), dict(temperature=0.7, min_p=0.05),
     dict(temperature=1.0), dict(temperature=0.0), dict(temperature=1.2, top_k=3000, top_p=0.99)],
    ids=str,
)
def test_pick_matches_reference_full_vocab(cfg, ties):
    """V = 151936 (Qwen3-Next): the large-candidate paths (radix sort, heap top-k) against the reference."""
    rng = np.random.default_rng(7)
    V = 151936
    p = P(seed=123, **cfg)
    for pos in range(6):
        logits = rand_logits(rng, V, scale=2.5, ties=ties)
        logits[rng.integers(0, V, 50)] += 12  # a realistic head: a few dozen likely tokens
        assert _core.pick_token(logits, p, pos) == pick_ref(logits, p, pos)


@pytest.mark.parametrize("cfg", [dict(temperature=0.7, min_p=0.05), dict(temperature=1.3, min_p=0.2, top_k=30),
                                 dict(temperature=0.45, min_p=0.5)], ids=str)
def test_pick_at_the_min_p_cut(cfg):
    """Logits whose weights straddle the min-p cut by a few float steps, scattered over the row and packed into one
    16-logit block: sampler.cpp skips blocks below a bound without scaling them, and must never drop a token the
    cut keeps (each such token carries ~min_p of the weight: a dropped one changes many picks)."""
    rng = np.random.default_rng(11)
    V, T = 4096, np.float32(cfg["temperature"])
    p = P(seed=5, **cfg)
    for trial in range(6):
        top = np.float32(rng.uniform(-20, 30))
        x = (top - np.float32(40) - rng.uniform(0, 5, V)).astype(np.float32)
        x[int(rng.integers(0, V))] = top
        m = np.float64(top / T)
        edge = np.float32((m + np.log(np.float64(np.float32(cfg["min_p"])))) * np.float64(T))
        near = [edge]
        for _ in range(10):
            near = [np.nextafter(near[0], np.float32(-np.inf))] + near + [np.nextafter(near[-1], np.float32(np.inf))]
        where = rng.choice(np.flatnonzero(x < top), len(near), replace=False) if trial % 2 else \
            16 * int(rng.integers(1, V // 16 - 2)) + np.arange(len(near))
        x[where] = np.array(near, np.float32)
        for pos in range(40):
            assert _core.pick_token(x, p, pos) == pick_ref(x, p, pos), (trial, pos)


def test_nonfinite_logits():
    rng = np.random.default_rng(3)
    V = 300
    for cfg in CONFIGS + [dict()]:
        p = P(seed=5, **cfg)
        for pos in range(20):
            logits = rand_logits(rng, V)
            logits[rng.integers(0, V, 40)] = np.nan
            logits[rng.integers(0, V, 40)] = -np.inf
            got = _core.pick_token(logits, p, pos)
            assert got == pick_ref(logits, p, pos)
            assert np.isfinite(logits[got])
    # +inf: the distribution is a point mass on the first +inf
    logits = np.zeros(10, np.float32)
    logits[[4, 7]] = np.inf
    assert _core.pick_token(logits, P(temperature=1.0), 0) == 4


def test_signed_zeros_tie_by_id():
    """-0.0 == +0.0: ties broken by id on every path (heap top-k, comparison sort, radix sort)."""
    for V, k in ((10, 2), (5000, 3000), (5000, 0)):
        logits = np.zeros(V, np.float32)
        logits[::2] = -0.0
        p = P(temperature=1.0, top_k=k, seed=4)
        picks = [_core.pick_token(logits, p, pos) for pos in range(300)]
        assert picks == [pick_ref(logits, p, pos) for pos in range(300)]
        assert max(picks) < (k or V) and len(set(picks)) > min(k or V, 300) // 3


# ---------------------------------------------------------------- greedy
def test_greedy_is_argmax():
    rng = np.random.default_rng(11)
    p = P()  # temperature 0
    for _ in range(20):
        logits = rand_logits(rng, 5000)
        assert _core.pick_token(logits, p, 0) == int(np.argmax(logits))
    logits = np.array([1, 5, -2, 5, np.nan, 5], np.float32)
    assert _core.pick_token(logits, p, 0) == 1  # lowest id on ties
    logits = np.array([np.nan, -np.inf, -3, np.nan], np.float32)
    assert _core.pick_token(logits, p, 0) == 2  # NaN never chosen
    for bad in ([np.nan, np.nan], [-np.inf, np.nan, -np.inf]):
        for q in (P(), P(temperature=1.0)):
            with pytest.raises(RuntimeError, match="NaN or -inf"):
                _core.pick_token(np.array(bad, np.float32), q, 0)
    # greedy ignores seed and position
    logits = rand_logits(rng, 100)
    assert {_core.pick_token(logits, P(seed=s), pos) for s in range(5) for pos in range(5)} == {int(np.argmax(logits))}


# ---------------------------------------------------------------- reproducibility and seeds
def test_reproducible_and_seed_dependent():
    rng = np.random.default_rng(0)
    V, T = 64, 400
    logits = rand_logits(rng, V, scale=0.5)  # flat: many tokens likely
    rows = np.tile(logits, (T, 1))
    inputs = np.zeros(T, np.int32)
    a = _core.sample_rows(rows, P(temperature=1.0, seed=1), EMPTY, inputs, 0)
    b = _core.sample_rows(rows, P(temperature=1.0, seed=1), EMPTY, inputs, 0)
    c = _core.sample_rows(rows, P(temperature=1.0, seed=2), EMPTY, inputs, 0)
    assert a.dtype == np.int32 and a.shape == (T,)
    assert np.array_equal(a, b)
    assert np.mean(a != c) > 0.8  # different seeds give different draws ...
    # ... from the same distribution
    pr = probs_ref(logits, P(temperature=1.0), V)
    top = np.argsort(-pr)[:8]
    for seq in (a, c):
        freq = np.bincount(seq, minlength=V) / T
        assert np.all(np.abs(freq[top] - pr[top]) < 5 * np.sqrt(pr[top] / T) + 1e-3)


# ---------------------------------------------------------------- statistics
@pytest.mark.parametrize(
    "cfg",
    [dict(temperature=1.0), dict(temperature=0.7), dict(temperature=1.0, top_k=5),
     dict(temperature=1.2, top_p=0.8), dict(temperature=1.0, min_p=0.1)],
    ids=str,
)
def test_frequencies_match_probabilities(cfg):
    rng = np.random.default_rng(21)
    V, N = 12, 40000
    logits = rand_logits(rng, V, scale=1.2)
    p = P(seed=99, **cfg)
    out = _core.sample_rows(np.tile(logits, (N, 1)), p, EMPTY, np.zeros(N, np.int32), 1000)
    pr = probs_ref(logits, p, V)
    if cfg.get("temperature") and len(cfg) == 1:  # plain temperature: the softmax itself
        sm = np.exp((logits.astype(np.float64) - logits.max()) / cfg["temperature"])
        assert np.allclose(pr, sm / sm.sum(), rtol=1e-6)
    counts = np.bincount(out, minlength=V)
    assert np.all(counts[pr == 0] == 0), "a cut token was sampled"
    kept = pr > 0
    expected = N * pr[kept]
    chi2 = float(np.sum((counts[kept] - expected) ** 2 / expected))
    df = max(int(kept.sum()) - 1, 1)
    assert chi2 < df + 8 * np.sqrt(2 * df) + 10, (chi2, df)


# ---------------------------------------------------------------- windows
PEN = dict(repetition_penalty=1.25, presence_penalty=0.3, frequency_penalty=0.15)


@pytest.mark.parametrize("last_n", [0, 1, 5, 16, 500])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_sample_rows_row_semantics(last_n, temperature):
    rng = np.random.default_rng(last_n * 10 + int(temperature * 10))
    V, T = 500, 7
    p = P(temperature=temperature, top_k=100, top_p=0.95, penalty_last_n=last_n, seed=17, **PEN)
    for n_committed in (0, 3, 120):
        committed = rng.integers(0, 40, n_committed).astype(np.int32)
        inputs = rng.integers(0, 40, T).astype(np.int32)
        logits = np.stack([rand_logits(rng, V, scale=2) for _ in range(T)])
        logits[:, :40] += 3  # make the penalised tokens matter
        before = logits.copy()
        pos0 = int(rng.integers(0, 10000))
        out = _core.sample_rows(logits, p, committed, inputs, pos0)
        assert np.array_equal(logits, before), "sample_rows must not modify its logits"
        for i in range(T):
            hist = np.concatenate([committed, inputs[: i + 1]]).astype(np.int32)
            pen = _core.apply_penalties(logits[i], p, hist)
            assert out[i] == _core.pick_token(pen, p, pos0 + i + 1)
            assert out[i] == pick_ref(penalties_ref(logits[i], p, hist), p, pos0 + i + 1)


def test_any_grouping_equals_rows_one_at_a_time():
    """Fixed token sequence: finishing its rows in windows of any sizes gives the same tokens as one by one."""
    rng = np.random.default_rng(5)
    V, N = 200, 60
    seq = rng.integers(0, 30, N + 1).astype(np.int32)
    logits = np.stack([rand_logits(rng, V) for _ in range(N)])
    for cfg in (dict(), dict(temperature=1.0, top_p=0.9, **PEN, penalty_last_n=10, seed=3)):
        p = P(**cfg)
        # row j has input seq[j] at position j, history seq[0..j], predicts position j+1
        serial = np.array([_core.sample_rows(logits[j:j + 1], p, seq[:j], seq[j:j + 1], j)[0] for j in range(N)])
        for trial in range(10):
            j, got = 0, []
            while j < N:
                T = min(int(rng.integers(1, 9)), N - j)
                got.extend(_core.sample_rows(logits[j:j + T], p, seq[:j], seq[j:j + T], j))
                j += T
            assert np.array_equal(np.array(got), serial), (cfg, trial)


def _toy_model_logits(prefix, V):
    """A deterministic stand-in for the model: next-token logits as a function of the whole prefix."""
    key = [len(prefix)] + [int(t) for t in prefix[-3:]]
    return (np.random.default_rng(key).standard_normal(V) * 2.5).astype(np.float32)


@pytest.mark.parametrize("cfg", [dict(), dict(temperature=0.9, top_k=20, top_p=0.9, seed=8),
                                 dict(temperature=1.1, min_p=0.02, seed=1, penalty_last_n=8, **PEN)], ids=str)
def test_speculative_windows_equal_serial(cfg):
    """The key exactness property: draft/verify windows with the spec's acceptance rule emit exactly the
    serial sequence, whatever the drafts and window sizes (engine spec sections 2.3 and 4)."""
    V, N = 40, 80
    p = P(**cfg)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]

    def step(committed, inputs):
        rows = np.stack([_toy_model_logits(committed + inputs[: i + 1], V) for i in range(len(inputs))])
        return _core.sample_rows(rows, p, np.array(committed, np.int32), np.array(inputs, np.int32), len(committed))

    committed, root, serial = prompt[:-1], prompt[-1], []
    while len(serial) < N:
        tok = int(step(committed, [root])[0])
        committed, root = committed + [root], tok
        serial.append(tok)

    rng = np.random.default_rng(17)
    for trial in range(4):
        committed, root, emitted, windows = prompt[:-1], prompt[-1], [], 0
        while len(emitted) < N:
            k = len(emitted)
            D = int(rng.integers(0, 8))
            drafts = [serial[k + j] if k + j < N and rng.random() < 0.75 else int(rng.integers(0, V))
                      for j in range(D)]
            inputs = [root] + drafts
            out = step(committed, inputs)
            i = 0
            while i < len(inputs) - 1 and out[i] == inputs[i + 1]:
                i += 1
            keep = i + 1
            emitted.extend(int(t) for t in out[:keep])
            committed, root = committed + inputs[:keep], int(out[i])
            windows += 1
        assert emitted[:N] == serial, trial
        assert windows < N  # some drafts were accepted


# ---------------------------------------------------------------- params and errors
BAD = [
    ("temperature", -0.5), ("temperature", float("nan")), ("temperature", float("inf")),
    ("top_k", -1),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", float("nan")),
    ("min_p", -0.1), ("min_p", 1.0),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("presence_penalty", float("nan")), ("frequency_penalty", float("inf")),
    ("penalty_last_n", -1),
]


@pytest.mark.parametrize("field,value", BAD, ids=lambda x: str(x))
def test_bad_params_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        P(**{field: value})
    p = P()
    setattr(p, field, value)
    with pytest.raises(ValueError, match=field):
        p.validate()
    logits = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=field):
        _core.pick_token(logits, p, 0)
    with pytest.raises(ValueError, match=field):
        _core.sample_rows(logits[None], p, EMPTY, np.zeros(1, np.int32), 0)


def test_params_object():
    p = P()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty,
            p.frequency_penalty, p.penalty_last_n, p.seed) == (0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 64, 0)
    assert not p.penalties_active()
    p = P(temperature=0.5, top_k=3, seed=2**64 - 1, repetition_penalty=1.1)
    assert p.seed == 2**64 - 1 and p.top_k == 3 and p.penalties_active()
    assert "top_k=3" in repr(p) and "temperature=0.5" in repr(p)
    with pytest.raises(TypeError):
        _core.SamplingParams(0.5)  # keyword-only


def test_shape_errors():
    p = P()
    with pytest.raises(ValueError, match="inputs"):
        _core.sample_rows(np.zeros((3, 8), np.float32), p, EMPTY, np.zeros(2, np.int32), 0)
    with pytest.raises(ValueError, match="n_vocab"):
        _core.pick_token(np.zeros(0, np.float32), p, 0)
    assert _core.sample_rows(np.zeros((0, 8), np.float32), p, EMPTY, EMPTY, 0).shape == (0,)
