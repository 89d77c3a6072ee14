"""Expert streaming (engine spec 6, issue 7): experts read from the file through a bounded cache give output
bit-identical to full residency (logits, plain and speculative generation) at every budget down to the
smallest legal one; the cache's pin / eviction contract under concurrency; read faults give clear errors and
leave the session retryable; O_DIRECT; the approximate (MoCE) routing mode is opt-in and named so."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import exactness
from strata_py import _core
from strata_py.model import Model


@pytest.fixture(scope="module")
def many_gguf(tmp_path_factory):
    """A tiny model with 32 experts top-4 (the conftest ones have 8 top-2): unions can exceed small caches."""
    from strata_py import synth
    synth.SIZES.setdefault("tiny-e32", dict(synth.SIZES["tiny"], n_expert=32, n_expert_used=4, n_ff_exp=64))
    return synth.write("tiny-e32", tmp_path_factory.mktemp("experts") / "tiny-e32-q8_0.gguf", "q8_0", seed=5)


@pytest.fixture(scope="module")
def many_ref(many_gguf):
    return Model.load(many_gguf, threads=2)


def _min_mib(path) -> int:
    with pytest.raises(ValueError, match="needs at least") as ei:
        Model.load(path, threads=2, cache_mib=0)
    return int(str(ei.value).split("needs at least ")[1].split(" MiB")[0])


def _budgets(path, ref):
    """The smallest legal budget, about a quarter and a half of the experts, and more than all of them."""
    lo = _min_mib(path)
    st = Model.load(path, threads=2, cache_mib=lo).expert_stats()
    all_mib = st["slot_bytes"] * st["experts_total"] / 2**20
    return [lo, max(lo + 1, int(all_mib * 0.25)), max(lo + 2, int(all_mib * 0.5)), int(all_mib) + 2]


def _logits_trace(model, toks):
    s = model.session(n_ctx=128)
    out = [s.run(toks[:19]).copy()]
    s.commit(19)
    for T, keep in ((1, 1), (5, 3), (8, 8), (1, 1), (3, 1), (6, 6), (2, 2)):
        i = len(s.tokens)
        out.append(s.run(toks[i:i + T]).copy())
        s.commit(keep)
    return out


def test_bit_identical_at_every_budget(many_gguf, many_ref):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, many_ref.n_vocab, 64).tolist()
    block = rng.integers(0, many_ref.n_vocab, 7).tolist()
    ref = _logits_trace(many_ref, toks)
    cfg = exactness.config("sampled", 3, 24, temperature=0.9)
    plain = exactness.plain(many_ref, block * 4, cfg)  # fully resident, draft="none"
    budgets = _budgets(many_gguf, many_ref)
    for mib in budgets:
        for prefetch in (True, False):
            m = Model.load(many_gguf, threads=2, cache_mib=mib, prefetch=prefetch, prefetch_root_only=mib == budgets[1])
            got = _logits_trace(m, toks)
            for i, (a, b) in enumerate(zip(ref, got)):
                np.testing.assert_array_equal(a, b, err_msg=f"cache_mib={mib} prefetch={prefetch} window {i}")
            st = exactness.assert_equals_plain(m, block * 4, cfg, ["suffix"], reference=plain, label=f"cache_mib={mib}")
            assert st["suffix"].drafted > 0
            es = m.expert_stats()
            assert es["streaming"] and es["routing"] == "natural" and es["read_errors"] == 0
            assert es["sync_misses"] + es["hits"] + es["hits_inflight"] == es["lookups"]
            assert es["prefetch_used"] + es["prefetch_wasted"] <= es["prefetch_issued"]
            assert es["bytes_read"] >= es["experts_read"] * 3 * 64 * 256 * 34 // 32
            if mib == budgets[0]:
                assert es["degraded_groups"] > 0 and es["evictions"] > 0  # the 19-row prompt's union > cache
            if mib == budgets[-1]:
                assert es["evictions"] == 0 and es["experts_read"] <= es["experts_total"]


def test_speculative_oracle_windows_identical_at_smallest_budget(many_gguf, many_ref):
    prompt = np.random.default_rng(4).integers(0, many_ref.n_vocab, 11).tolist()
    m = Model.load(many_gguf, threads=2, cache_mib=_min_mib(many_gguf))
    exactness.assert_equals_plain(m, prompt, exactness.config("greedy", 0, 30),
                                  ["none"] + [exactness.Adversarial(r) for r in (0, 2, 7)], ref_model=many_ref)


def test_f32_and_mtp_model(tiny_q8_gguf, tiny_q8_model):
    """The conftest q8 model (with an MTP block, whose experts stay mapped) streams exactly too."""
    toks = np.random.default_rng(1).integers(0, tiny_q8_model.n_vocab, 64).tolist()
    ref = _logits_trace(tiny_q8_model, toks)
    m = Model.load(tiny_q8_gguf, threads=2, cache_mib=_min_mib(tiny_q8_gguf))
    for a, b in zip(ref, _logits_trace(m, toks)):
        np.testing.assert_array_equal(a, b)
    s = m.session(n_ctx=64, mtp=True)
    s.run(toks[:5])
    s.commit(5)
    assert len(s.mtp_draft(toks[5], 3)) == 3


def test_budget_validation(many_gguf):
    lo = _min_mib(many_gguf)
    assert Model.load(many_gguf, threads=2, cache_mib=lo).streaming
    assert not Model.load(many_gguf, threads=2, cache_mib="full").streaming
    assert Model.load(many_gguf, threads=2).expert_stats() == {"streaming": False}
    for bad in (-2, "half", 1.5, True):
        with pytest.raises(ValueError, match="cache_mib"):
            Model.load(many_gguf, threads=2, cache_mib=bad)
    with pytest.raises(ValueError, match="approximate"):
        Model.load(many_gguf, threads=2, routing="approximate")


@pytest.mark.parametrize("threads,max_n,fail_every", [(2, 3, 0), (6, 8, 0), (8, 4, 5)])
def test_cache_pins_and_eviction_under_concurrency(threads, max_n, fail_every):
    """Many threads acquire / load / verify / release random key sets on an 8-slot cache while another thread
    prefetches: a pinned slot is never overwritten, failed loads are seen by every waiter and never used,
    and every slot is evictable again at the end (the checks are in C++, see bindings/model.cpp)."""
    c = _core.expert_cache_stress(slots=8, keys=24, threads=threads, iters=1500, max_n=max_n, fail_every=fail_every,
                                  seed=threads)
    assert c["lookups"] == c["hits"] + c["hits_inflight"] + c["misses"]
    assert c["evictions"] > 0 and c["verified"] > 0
    if fail_every:
        assert c["load_failures"] > 0 and c["failures_seen"] >= c["load_failures"] - c["prefetch_issued"]


@pytest.mark.parametrize("kind,match", [("short", "short read"), ("eio", "I/O error")])
def test_read_faults_are_clear_and_retryable(many_gguf, many_ref, kind, match):
    toks = np.random.default_rng(2).integers(0, many_ref.n_vocab, 40).tolist()
    s0 = many_ref.session(n_ctx=64)
    s0.run(toks[:12]); s0.commit(12)
    want = s0.run(toks[12:16]).copy()
    m = Model.load(many_gguf, threads=2, cache_mib=_min_mib(many_gguf), prefetch=False)
    s = m.session(n_ctx=64, fold="eager")
    s.run(toks[:12]); s.commit(12)
    m._inject_io_fault(kind)
    with pytest.raises(RuntimeError, match=match) as ei:
        s.run(toks[12:16])  # a verify window: committed state untouched, so it can be retried as is
    msg = str(ei.value)
    assert str(many_gguf) in msg and "_exps.weight" in msg and "expert " in msg and "layer " in msg
    np.testing.assert_array_equal(s.run(toks[12:16]), want)
    assert m.expert_stats()["read_errors"] == 1
    # a step window (DeltaNet state updated in place) refuses further runs until restored
    s.commit(1)
    cp = s.checkpoint()
    m._inject_io_fault(kind, count=100)
    with pytest.raises(RuntimeError, match="restored from a checkpoint or reset"):
        s.run([toks[13]])
    with pytest.raises(RuntimeError, match="refused"):
        s.run([toks[13]])
    m._inject_io_fault("none")
    s.restore(cp)
    s1 = many_ref.session(n_ctx=64)
    s1.run(toks[:13]); s1.commit(13)
    np.testing.assert_array_equal(s.run([toks[13]]), s1.run([toks[13]]))


def test_file_changed_under_us(many_gguf, many_ref, tmp_path):
    path = tmp_path / "copy.gguf"
    shutil.copy(many_gguf, path)
    toks = np.random.default_rng(3).integers(0, many_ref.n_vocab, 30).tolist()
    m = Model.load(path, threads=2, cache_mib=_min_mib(path), prefetch=False)
    s = m.session(n_ctx=64)
    s.run(toks[:10]); s.commit(10)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "rewritten": a new modification time
    # Session::run checks the file before the forward (Model::check_files), so this is refused before any
    # expert is read; a change in mid-forward is caught per read batch, naming the expert (ExpertStream)
    with pytest.raises(RuntimeError, match="changed since it was loaded") as ei:
        s.run(toks[10:14])
    assert str(path) in str(ei.value) and "modified" in str(ei.value)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    s0 = many_ref.session(n_ctx=64)
    s0.run(toks[:10]); s0.commit(10)
    np.testing.assert_array_equal(s.run(toks[10:14]), s0.run(toks[10:14]))


def test_o_direct(many_gguf, many_ref):
    try:
        m = Model.load(many_gguf, threads=2, cache_mib=_min_mib(many_gguf) + 1, o_direct=True)
    except ValueError as e:
        pytest.skip(f"O_DIRECT not supported here: {e}")
    toks = np.random.default_rng(5).integers(0, many_ref.n_vocab, 64).tolist()
    for a, b in zip(_logits_trace(many_ref, toks), _logits_trace(m, toks)):
        np.testing.assert_array_equal(a, b)
    es = m.expert_stats()
    assert es["o_direct"] and es["bytes_read"] % 4096 == 0 and es["experts_read"] > 0


def test_approximate_routing_is_opt_in_and_reported(many_gguf, many_ref):
    """MoCE changes the model (never called lossless); with the bonus at 0 and everything protected it is natural."""
    toks = np.random.default_rng(6).integers(0, many_ref.n_vocab, 64).tolist()
    ref = _logits_trace(many_ref, toks)
    lo = _min_mib(many_gguf)
    same = Model.load(many_gguf, threads=2, cache_mib=lo, routing="approximate", approx_protect=4, approx_draft_protect=4)
    for a, b in zip(ref, _logits_trace(same, toks)):
        np.testing.assert_array_equal(a, b)
    m = Model.load(many_gguf, threads=2, cache_mib=lo * 3, routing="approximate", approx_protect=1, approx_bonus=3.0)
    got = _logits_trace(m, toks)
    es = m.expert_stats()
    assert es["routing"] == "approximate" and es["approx_changed_frac"] > 0
    assert any(not np.array_equal(a, b) for a, b in zip(ref, got))
    assert all(np.isfinite(g).all() for g in got)


def test_cli_stats_include_experts(many_gguf, tmp_path, capsys):
    import json

    from strata_py.generate import main
    out = tmp_path / "s.json"
    assert main(["--model", str(many_gguf), "--cache-mib", str(_min_mib(many_gguf) + 1), "-n", "8", "--stats",
                 "--stats-json", str(out), "--json", "def f(x):"]) == 0
    sd = json.loads(out.read_text())
    for k in ("bytes_read", "sync_misses", "late_wait_s", "prefetch_issued", "prefetch_used", "prefetch_wasted",
              "evictions", "union_mean", "hit_rate", "prefetch_precision", "prefetch_recall"):
        assert k in sd["experts"], k
    assert sd["experts"]["lookups"] > 0
    err = capsys.readouterr().err
    assert "experts.hit_rate" in err


def test_streams_of_models_loaded_one_after_another(tmp_path):
    """The predictor's per-thread record belongs to one stream: a model with more layers loaded after another
    one was freed (its stream often lands at the freed stream's address) must not index the old record past
    its end (a heap overflow the gguf fuzz corpus found when replayed in one process; ASan in
    test_sanitizers.py turns a regression into a report). Each model's greedy output equals its resident twin's."""
    from strata_py import synth
    synth.SIZES.setdefault("micro-l8", dict(synth.SIZES["micro"], n_layer=8))
    small = synth.write("micro", tmp_path / "micro.gguf", "f32", seed=1)
    large = synth.write("micro-l8", tmp_path / "micro-l8.gguf", "f32", seed=2)
    cfg = exactness.config("greedy", 0, 6)
    want = {p: exactness.plain(Model.load(p, threads=1), [1, 2, 3], cfg) for p in (small, large)}
    for _ in range(6):
        for p in (small, large):
            m = Model.load(p, threads=1, cache_mib=_min_mib(p), prefetch=True)
            assert m.streaming
            assert exactness.plain(m, [1, 2, 3], cfg) == want[p]
            del m
