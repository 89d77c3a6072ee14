"""Speculative decoding through the public loop emits exactly the plain tokens (greedy and sampled, several
seeds, many prompts and lengths); the drafter registry; the length controller on synthetic inputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from strata_py import drafting
from strata_py.config import GenerationConfig
from strata_py.controller import LengthController, WindowCosts, expected_keep, window_costs
from strata_py.drafting.suffix import SuffixDrafter

import exactness
from exactness import Oracle as _Oracle


def _prompts(V, seed):
    """Random, repetitive (a random block several times) and short prompts."""
    rng = np.random.default_rng(seed)
    block = rng.integers(0, V, 9).tolist()
    return {
        "random": rng.integers(0, V, 23).tolist(),
        "repeat": block * 5,
        "repeat-tail": block * 3 + block[:5],
        "short": rng.integers(0, V, 2).tolist(),
        "one": [int(rng.integers(0, V))],
    }


@pytest.mark.parametrize("which", ["tiny_model", "tiny_q8_model"])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_suffix_and_auto_equal_plain(request, which, mode):
    """Against draft="none" (exactness.py); the q8 model has an MTP block, so MTP drafts too."""
    model = request.getfixturevalue(which)
    drafters = ["suffix", "auto"] + (["mtp"] if which == "tiny_q8_model" else [])
    n_drafted = 0
    for label, cfg0 in exactness.cases((mode,)):
        for name, prompt in _prompts(model.n_vocab, cfg0.seed).items():
            for n in (1, 2, 7, 33):
                cfg = cfg0.replace(max_tokens=n)
                st = exactness.assert_equals_plain(model, prompt, cfg, drafters, label=f"{label} {name} n={n}")
                assert len(st["plain"]) == n
                for d in drafters:
                    assert sum(int(T) * c for T, c in st[d].as_dict()["t_hist"].items()) >= n
                n_drafted += exactness.drafted(st)
    assert n_drafted > 0  # repetitive prompts do produce drafts


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_adversarial_drafters_through_generate_ids(tiny_q8_model, mode):
    """Always wrong, right for i tokens then wrong (every i), always right: every T and keep occurs."""
    model = tiny_q8_model
    W = 16  # the window this test's configs ask for (max_draft=15, stated: not GenerationConfig's default)
    rights = [*range(W), None]
    for label, cfg in exactness.cases((mode,), seeds=(0, 3), max_tokens=41, max_draft=W - 1):
        prompt = _prompts(model.n_vocab, cfg.seed)["random"]
        st = exactness.assert_equals_plain(model, prompt, cfg, [exactness.Adversarial(r) for r in rights], label=label)
        always = st[str(exactness.Adversarial(None))]
        assert always.accepted == always.drafted and max(int(t) for t in always.t_hist) == W


def _fixed_table() -> WindowCosts:
    """A C(T) table that measurements do not move (cost_ema = 0, every T measured twice), windows cheap."""
    costs = WindowCosts(cost_ema=0.0)
    for T in range(1, 9):
        for _ in range(2):
            costs.record(T, 1e-3 * (1 + 0.05 * (T - 1)))
    return costs


class _ControlledOracle(_Oracle):
    """An oracle whose draft count the length controller picks (real acceptance for the controller)."""

    def __init__(self, *a, controller):
        super().__init__(*a)
        self.ctl = controller

    def propose(self, context, max_drafts):
        drafts = super().propose(context, max_drafts)
        return drafts[:self.ctl.choose(len(drafts), 16)]

    def observe(self, drafts, accepted):
        self.ctl.observe(16, len(drafts), accepted)

    def record_window(self, T, seconds):
        self.ctl.record_window(T, seconds)


def test_controller_drives_the_loop_exactly(tiny_model):
    prompt = _prompts(tiny_model.n_vocab, 5)["random"]
    cfg = exactness.config("sampled", 0, 80)
    plain = exactness.plain(tiny_model, prompt, cfg)
    for right in (None, 2):
        # a fixed cost table: the controller's choices then depend on the acceptance it observes, not on how
        # fast this machine happens to be right now
        costs = _fixed_table()
        seeded = costs.samples
        ctl = LengthController(costs=costs)
        orc = _ControlledOracle(plain, len(prompt), right, tiny_model.n_vocab, controller=ctl)
        st = exactness.assert_equals_plain(tiny_model, prompt, cfg, [orc], reference=plain)[str(orc)]
        assert st.windows < 80 and st.accepted > 0
        # every window's cost reached the controller; the first warmup_windows are not used as C(T) samples
        assert ctl._seen == st.windows
        assert ctl.costs.samples == seeded + st.windows - ctl.warmup_windows


def _fixed_costs(model) -> WindowCosts:
    """Give `model` a fixed C(T) table (_fixed_table): `auto` then drafts by the acceptance it sees, whatever
    the machine's speed and the other tests' windows on this session-scoped model. Returns the table it
    replaced."""
    old = window_costs(model)
    model._window_costs = _fixed_table()
    return old


def test_real_acceptance_via_global_index(tiny_model):
    """A previous identical request in the global index gives the real drafter real acceptance."""
    from strata_py.drafting import suffix as sfx

    prompt = _prompts(tiny_model.n_vocab, 8)["random"]
    old = _fixed_costs(tiny_model)
    try:
        _check_global_index_acceptance(tiny_model, prompt, sfx)
    finally:
        tiny_model._window_costs = old


def _check_global_index_acceptance(tiny_model, prompt, sfx):
    for mode, seed in (("greedy", 0), ("sampled", 4)):
        sfx._GLOBAL.clear()
        extra = {"global_index_tokens": 4096}
        cfg = exactness.config(mode, seed, 60, extra=extra)
        plain = exactness.plain(tiny_model, prompt, cfg)
        exactness.assert_equals_plain(tiny_model, prompt, cfg, ["auto"], reference=plain, label="first")
        st_ = exactness.assert_equals_plain(tiny_model, prompt, cfg, ["suffix", "auto"], reference=plain)
        for draft in ("suffix", "auto"):
            st = st_[draft]
            assert st.accepted >= (30 if draft == "suffix" else 10) and st.accepted >= 0.9 * st.drafted, draft
        sfx._GLOBAL.clear()


def test_fixed_t_runs_that_window_and_stays_exact(tiny_model):
    prompt = _prompts(tiny_model.n_vocab, 2)["repeat"]
    st_ = exactness.assert_equals_plain(tiny_model, prompt, exactness.config("greedy", 0, 30, fixed_t=4),
                                        ["suffix", "auto"])
    for draft in ("suffix", "auto"):
        st = st_[draft]
        assert set(st.t_hist) <= {1, 2, 3, 4} and st.t_hist.get(4, 0) >= 5


# ------------------------------------------------------------------------------------------ the drafter

def test_drafter_indexes_incrementally_and_restarts_on_a_new_context():
    d = SuffixDrafter(GenerationConfig(min_match=2, max_draft=3))
    ctx = [1, 2, 3, 4, 1, 2]
    assert d.propose(ctx, 7) == [3, 4, 1]
    ctx += [3, 9]
    d.observe([3, 4, 1], 1)
    assert d.propose(ctx, 7) == [] and len(d.index) == 8
    ctx += [1, 2, 3]
    assert d.propose(ctx, 2) == [9, 1]  # "1 2 3" occurred last before 9
    assert len(d.index) == 11
    assert d.propose([5, 6, 5], 3) == [] and d.index.tokens == [5, 6, 5]  # not a continuation: reindexed
    s = d.stats()["draft"]
    assert s["lookups"] == 4 and s["offered"] == 5 and s["kept"] == 1


def test_registry():
    assert {"suffix", "auto"} <= set(drafting.names())
    with pytest.raises(ValueError, match="unknown drafter 'bogus'.*auto.*suffix"):
        drafting.create("bogus", model=None, cfg=GenerationConfig())
    with pytest.raises(ValueError, match="already registered"):
        drafting.register("suffix")(lambda **kw: None)
    d = drafting.create("auto", model=None, cfg=GenerationConfig())
    assert hasattr(d, "propose") and hasattr(d, "observe") and d.controller is not None
    assert drafting.create("suffix", model=None, cfg=GenerationConfig()).controller is None


def test_cli_stats_json(tiny_gguf, tmp_path, capsys):
    from strata_py.generate import main

    out = tmp_path / "stats.json"
    assert main(["--model", str(tiny_gguf), "--draft", "auto", "-n", "24", "--stats-json", str(out),
                 "--json", "def f(x):\n    return x\n" * 4]) == 0
    sd = json.loads(out.read_text())
    for k in ("decode_tok_s", "t_hist", "window_ms_p99", "e_keep", "acceptance"):
        assert k in sd
    for k in ("coverage", "match_len_hist", "offered", "kept"):
        assert k in sd["draft"]
    assert "chosen_t_hist" in sd["controller"] and "cost_ms" in sd["controller"]
    capsys.readouterr()


# ---------------------------------------------------------------------------------------- the controller

def _trained(acc: float, cost, windows=400, seed=0, match_len=16):
    """A controller fed synthetic outcomes: each draft accepted with probability acc, C(T) = cost(T)."""
    rng = np.random.default_rng(seed)
    c = LengthController(probe_every=10**9)
    for T in range(1, 9):
        c.record_window(T, cost(T))
    for _ in range(windows):
        D = 7
        a = 0
        while a < D and rng.random() < acc:
            a += 1
        c.observe(match_len, D, a)
    return c


def test_expected_keep_matches_the_spec_example():
    E = expected_keep([0.7] * 3)
    assert abs(E[2] - 2.19) < 1e-9 and abs(E[3] - 2.533) < 1e-9


def test_controller_long_windows_when_acceptance_high_and_windows_cheap():
    c = _trained(0.95, lambda T: 0.010 * (1 + 0.05 * (T - 1)))
    assert c.choose(7, 16) == 7
    assert c.choose(3, 16) == 3  # bounded by what is available


def test_controller_plain_decode_when_nothing_is_accepted():
    c = _trained(0.0, lambda T: 0.010 * (1 + 0.05 * (T - 1)))
    assert c.choose(7, 16) == 0


def test_controller_plain_decode_when_windows_cost_as_much_as_serial():
    c = _trained(0.9, lambda T: 0.010 * T)  # E(T) < T always, so any longer window loses
    assert c.choose(7, 16) == 0


def test_controller_intermediate_length_follows_the_marginal_rule():
    cost = lambda T: 0.010 * (1 + 0.3 * (T - 1))
    c = _trained(0.6, cost, windows=3000)
    d = c.choose(7, 16)
    a = c.acceptance(16, 7)
    E = expected_keep(a)
    rate = [E[T - 1] / cost(T) for T in range(1, 9)]
    assert d + 1 == 1 + int(np.argmax(rate)) and 0 < d < 7


def test_controller_acceptance_is_per_bucket_and_position():
    c = LengthController()
    for _ in range(200):
        c.observe(40, 4, 4)   # long matches: always right
        c.observe(4, 4, 0)    # short matches: always wrong
    assert min(c.acceptance(40, 4)) > 0.95 and c.acceptance(4, 4)[0] < 0.05
    # draft i of a match of length L, never observed in its bucket, follows draft 1 of a match of length
    # L + i - 1 (the context matches that far once the earlier drafts are in)
    assert c.acceptance(4, 4)[1] < 0.05
    shift = LengthController()
    for _ in range(200):
        shift.observe(6, 1, 1)    # matches of 6-7 tokens: the first draft always right
        shift.observe(12, 1, 0)   # matches of 12-15 tokens: always wrong
    a = shift.acceptance(6, 7)
    assert a[1] > 0.95 and a[6] < 0.05  # draft 2 of a 6-match ~ a 7-match; draft 7 ~ a 12-match
    fresh = LengthController()
    for _ in range(50):
        fresh.observe(8, 1, 1)  # only one draft ever offered: draft 2's estimate follows draft 1's
    assert fresh.acceptance(8, 3)[1] > 0.9
    for T in range(1, 9):
        c.record_window(T, 0.01 * (1 + 0.1 * (T - 1)))
    assert c.choose(7, 40) >= 4 and c.choose(7, 4) == 0


def test_controller_probes_after_a_long_idle_stretch_and_fixed_t():
    c = _trained(0.0, lambda T: 0.01 * (1 + 0.05 * (T - 1)))
    c.probe_every = 5
    picks = [c.choose(7, 16) for _ in range(35)]
    # a probe after 5 idle windows, then the gap doubles while drafting keeps not paying: 10, then 20
    assert [i for i, p in enumerate(picks) if p] == [4, 14, 34] and c.probes == 3
    # deep probes: a controller that settled on one draft of 3 available offers a second every 4th window
    deep = LengthController(probe_every=10**9, warmup_windows=0)
    for T in range(1, 5):
        deep.record_window(T, 0.01 * (1 + 0.05 * (T - 1)))
    for _ in range(50):
        deep.observe(16, 3, 1)  # draft 1 always right, draft 2 always wrong: one draft pays best
    deep.deep_probe_every = 4
    picks = [deep.choose(3, 16) for _ in range(12)]
    assert picks == [1, 1, 1, 2] * 3 and deep.deep_probes == 3
    deep.deep_probe_every = 0
    assert [deep.choose(3, 16) for _ in range(8)] == [1] * 8  # off: never
    f = LengthController(fixed_t=3)
    assert [f.choose(a, 8) for a in (0, 1, 2, 7)] == [0, 1, 2, 2]
    with pytest.raises(ValueError, match="fixed_t"):
        LengthController(fixed_t=-1)


def test_controller_ignores_warmup_costs():
    # a cold first window (2.5x) must not become C(T) for a T the controller then avoids
    c = LengthController(warmup_windows=2)
    c.record_window(3, 0.050)
    c.record_window(1, 0.030)
    assert c.costs.samples == 0
    c.record_window(1, 0.010)
    c.record_window(3, 0.016)
    assert c.cost(1) == 0.010 and c.cost(3) == 0.016


def test_controller_single_slow_sample_does_not_set_the_line():
    # once two Ts are measured twice, a T measured once (e.g. a slow window) no longer bends C(T)
    c = LengthController(warmup_windows=0)
    c.record_window(8, 0.090)  # one slow window at T = 8, then the controller sticks to T = 1, 2
    for _ in range(2):
        c.record_window(1, 0.010)
        c.record_window(2, 0.012)
    assert abs(c.cost(8) - 0.024) < 1e-12 and abs(c.cost(4) - 0.016) < 1e-12


def test_controller_cost_estimates():
    c = WindowCosts(cost_ema=0.5)
    assert c(3) > c(1)  # prior before any measurement
    c.record(1, 0.010)
    assert abs(c(3) - 0.010 * (1 + 2 * c.slope_prior)) < 1e-12  # one point: prior slope
    c.record(2, 0.012)
    assert abs(c(4) - 0.016) < 1e-12  # two points: the fitted line
    c.record(2, 0.014)
    assert abs(c(2) - 0.014) < 1e-12  # the first measurement of a T (cold caches) is replaced
    c.record(2, 0.016)
    assert abs(c(2) - 0.015) < 1e-12  # then an EMA
    c.record(2, 0.100)
    assert abs(c(2) - 0.01875) < 1e-12  # a spike (preemption) counts as 1.5x the estimate


def test_window_costs_smooth_over_T_once_two_are_measured():
    # noisy per-T estimates (C(6) > C(7)) must not rank longer windows out of order: the weighted line
    c = WindowCosts()
    for T, sec in ((1, 0.010), (4, 0.016), (6, 0.030), (7, 0.020)):
        c.record(T, sec)
        c.record(T, sec)
    assert all(c(T + 1) > c(T) for T in range(1, 8))
    assert c(6) < 0.030 and c(7) > 0.020


def test_window_costs_are_shared_per_model(tiny_model):
    a = drafting.create("auto", model=tiny_model, cfg=GenerationConfig())
    b = drafting.create("auto", model=tiny_model, cfg=GenerationConfig())
    assert a.controller.costs is b.controller.costs is window_costs(tiny_model)
    assert drafting.create("auto", model=None, cfg=GenerationConfig()).controller.costs is not a.controller.costs


def test_length_scale_is_the_likelihood_maximum():
    """length_scale() is the root of the log-likelihood's derivative (to float precision), from any history of
    first-draft outcomes, whatever the fit before it; bucket_of puts each length in the bucket of its lower edge."""
    from strata_py.controller import BUCKET_EDGES, bucket_of
    for L in range(1, 100):
        b = bucket_of(L)
        assert BUCKET_EDGES[b] <= L and (b + 1 == len(BUCKET_EDGES) or L < BUCKET_EDGES[b + 1])
    rng = np.random.default_rng()
    c = LengthController(max_window=4)
    for _ in range(300):
        L = int(rng.integers(1, 90))
        c.observe(L, 3, int(rng.integers(0, 4)) if rng.random() < 0.9 else 0)
        s = c.length_scale()
        obs = [(4.0, 1.0, 1.0)] + [(float(lo), c._acc[b][0], c._rej[b][0]) for b, lo in enumerate(BUCKET_EDGES)]
        rej = sum(r for _, _, r in obs)
        # d log-likelihood / ds = rej / s - sum(n / (L + s)): zero at the maximum
        assert s > 0 and abs(rej / s - sum((a + r) / (Lb + s) for Lb, a, r in obs)) <= 1e-9 * rej / s



@pytest.mark.parametrize("steered", [False, True], ids=["plain", "dry+phrases"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_verified_prefix_is_the_kept_rows_of_the_full_finish(tiny_q8_model, steered, temperature):
    """sample(verified_prefix=True) finishes rows only up to the first whose token is not the next input: those
    rows equal the full finish's (and serial decoding's), and there are exactly as many as the window keeps."""
    from strata_py.model import sampling_params
    from strata_py.steering import Steering
    model = tiny_q8_model
    V = model.n_vocab
    cfg = GenerationConfig(temperature=temperature, seed=5, dry_multiplier=0.8 if steered else 0.0,
                           ban_phrases=[("a b", 4.0)] if steered else [])
    params = sampling_params(cfg)
    s = model.session(n_ctx=512, max_window=16)
    rng = np.random.default_rng(3)
    s.run(rng.integers(0, V, 40).tolist())
    s.commit(40)
    if steered:
        Steering(model, cfg).attach(s, s.position)
    root, kept = int(rng.integers(0, V)), []
    for trial in range(12):
        T = int(rng.integers(2, 17))
        cp = s.checkpoint()
        serial, cur = [], root  # serial decoding's next T - 1 tokens
        for _ in range(T - 1):
            s.run([cur])
            cur = int(s._core.sample(params)[0])
            s.commit(1)
            serial.append(cur)
        s.restore(cp)
        agree = int(rng.integers(0, T))  # drafts right for a stretch, then random
        inputs = [root] + serial[:agree] + rng.integers(0, V, T - 1 - agree).tolist()
        s.run(inputs)
        full = s._core.sample(params).tolist()
        pre = s._core.sample(params, None, True).tolist()
        keep = next((i + 1 for i in range(T - 1) if full[i] != inputs[i + 1]), T)
        assert full[:agree] == serial[:agree], trial
        assert pre == full[:keep], (trial, T, agree)
        kept.append(keep)
        s.commit(keep)
        root = pre[-1]
    assert len(set(kept)) >= 4, kept
