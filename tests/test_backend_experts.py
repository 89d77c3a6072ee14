"""Routed experts streamed into a bounded cache of backend memory (csrc/model/backend_experts.h; issue 19's experts
from host memory): with Model.load(cache_mib=..., backend=B) a backend session's logits and hidden rows equal the
native session's (every expert resident in the mapping) bit for bit, for prompt windows, T = 1 steps and verify
windows with random keeps, at the least budget (long prompt windows then run their experts in groups of rows), at a
quarter of the experts and with every expert fitting; decoding (greedy, sampled, suffix-drafted) gives the native
tokens; the counters add up (every lookup a hit or a miss, every copy a miss or a prefetch, the bytes those copies
moved); a budget below one row's experts is refused at load, naming the file and the least budget. Both sources of
the missing experts: pinned host memory holding all of them ("host") and the GGUF read into a staging ring ("file":
the same cache decisions and counters; a failed read names the file, tensor and expert, and the window can be run
again). B is the CPU
backend (runs everywhere, CI included) and the GPU where one is usable (the CPU side then on its scalar kernels:
the GPU's attention is attend_ref's order)."""
from __future__ import annotations

import numpy as np
import pytest

from backend_util import decode_equal, tiny_qwen35moe, windows_equal
from seeds import fresh_rng
from strata_py import _core
from strata_py.model import Model


# backend: conftest.py's fixture (the CPU backend, and the GPU where one is usable)

def least_mib(path) -> int:
    with pytest.raises(ValueError, match="needs at least") as e:
        Model.load(path, cache_mib=0, backend="cpu-backend")
    return int(str(e.value).split("needs at least ")[1].split(" MiB")[0])


def streamed(path, mib, backend, **kw):
    """The model with a backend expert budget, and a session of it held open: the counters live with the backend
    model, which lives while a session does (windows_equal's sessions come and go)."""
    m = Model.load(path, cache_mib=mib, backend="cuda" if backend == "cuda" else "cpu-backend", threads=2, **kw)
    m._held = m.session(backend=backend)
    return m


def check_counters(s):
    assert s["streaming"] and s["where"] == "backend"
    assert s["lookups"] == s["hits"] + s["hits_inflight"] + s["sync_misses"]
    assert s["experts_read"] == s["sync_misses"] + s["prefetch_issued"]
    assert s["bytes_read"] >= s["experts_read"] * 1 and (s["experts_read"] == 0) == (s["bytes_read"] == 0)
    assert s["prefetch_used"] + s["prefetch_wasted"] <= s["prefetch_issued"]
    assert s["read_errors"] == 0 and s["late_waits"] == 0


@pytest.mark.parametrize("source", ["host", "file"])
@pytest.mark.parametrize("budget", ["least", "quarter", "all"])
def test_streamed_windows_equal_resident(budget, source, backend):
    path = Model.load(threads=1).path
    all_mib = 64  # more than the default model's 256 experts of 52 KiB
    base = Model.load(path, cache_mib=all_mib, backend="cpu-backend").expert_stats()
    assert base["slots"] == base["experts_total"] == 256
    mib = {"least": least_mib(path), "quarter": max(least_mib(path), (base["slot_bytes"] * 64) >> 20), "all": all_mib}[budget]
    m = streamed(path, mib, backend, expert_source=source)
    windows_equal(m, backend, fresh_rng(), n_windows=12, label=f"{budget} ({mib} MiB from {source})")
    s = m.expert_stats()
    check_counters(s)
    assert s["source"] == source
    assert s["union_layers"] > 0 and s["lookups"] > 0
    if budget == "all":
        assert s["evictions"] == 0 and s["experts_read"] <= s["experts_total"]
    else:
        assert s["evictions"] > 0
    m.reset_expert_stats()
    assert m.expert_stats()["lookups"] == 0


@pytest.mark.parametrize("source", ["host", "file"])
def test_long_prompt_in_groups_at_the_least_budget(tiny_q8_model, source, backend):
    """A 150-row prompt (pieces of 64 rows): at the least budget a piece's union is larger than the cache, so its
    experts run in groups of rows (degraded_groups), with the resident session's logits."""
    path = tiny_q8_model.path
    m = streamed(path, least_mib(path), backend, expert_source=source)
    cfg = m.config
    assert m.expert_stats()["slots"] < cfg["n_expert"]
    windows_equal(m, backend, fresh_rng(), n_windows=4, prompt=150, n_ctx=320, label="150-row prompt")
    s = m.expert_stats()
    check_counters(s)
    assert s["degraded_groups"] > 0


def test_qwen35moe_streamed(tmp_path, backend):
    q = tiny_qwen35moe(tmp_path, seed=31, threads=2)
    windows_equal(streamed(q.path, least_mib(q.path) + 1, backend), backend, fresh_rng(), label="qwen35moe streamed")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("draft", ["none", "suffix"])
def test_streamed_decode_equals_native(temperature, draft, backend):
    path = Model.load(threads=1).path
    source = "file" if draft == "suffix" else "host"
    m = streamed(path, least_mib(path) + 1, backend, expert_source=source)
    decode_equal(m, backend, fresh_rng(), temperature=temperature, draft=draft,
                 label=f"streamed {draft} t={temperature} from {source}")


@pytest.fixture
def staging_cap():
    """_core.backend_expert_staging_cap(n) for the test, the default after it."""
    yield _core.backend_expert_staging_cap
    _core.backend_expert_staging_cap(0)


@pytest.mark.parametrize("cap", [0, 3])
def test_file_source_makes_the_host_sources_decisions(cap, backend, staging_cap):
    """The same windows on a model reading its experts from the file (3 readers; a staging ring of the default 64
    slots, or of 3, which one layer's reads wrap many times) and on one holding them in pinned host memory: the same
    logits and the same cache counters (hits, misses, evictions, prefetches, bytes), since both make a copy Ready at
    the same point."""
    staging_cap(cap)
    path = Model.load(threads=1).path
    rng = fresh_rng()
    toks = rng.integers(0, Model.load(threads=1).n_vocab, 90).tolist()
    keep = [int(k) for k in rng.integers(1, 5, 5)]
    runs, stats = [], []
    for source in ("host", "file"):
        m = streamed(path, least_mib(path), backend, expert_source=source, io_threads=3)
        s = m.session(n_ctx=160, backend=backend)
        out = [np.asarray(s.run(toks[:70])).copy()]
        s.commit(70)
        pos = 70
        for k in keep:  # verify windows of 4 rows, k of them kept
            out.append(np.asarray(s.run(toks[pos:pos + 4])).copy())
            s.commit(k)
            pos += k
        runs.append(out)
        stats.append(m.expert_stats())
    for a, b in zip(*runs):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    h, f = stats
    assert h["source"] == "host" and f["source"] == "file"
    assert f["experts_read"] > 64  # more reads than the default model's staging ring has slots: it wrapped
    assert f["union_mean"] > 3  # (with 3 slots, within a layer's reads too)
    for key in ("lookups", "hits", "sync_misses", "evictions", "experts_read", "bytes_read", "prefetch_issued",
                "prefetch_used", "prefetch_wasted", "degraded_groups"):
        assert h[key] == f[key], f"{key}: host {h[key]}, file {f[key]}"


@pytest.mark.parametrize("cap", [0, 2])
@pytest.mark.parametrize("kind,match", [("short", "short read"), ("eio", "I/O error")])
def test_file_source_read_faults_are_clear_and_retryable(kind, match, cap, backend, staging_cap):
    """A failed expert read (injected: a short read, EIO) fails the window with an error naming the file, the tensor
    and the expert; its slots are not used, and the window runs again with the resident session's logits. With a
    staging ring of 2 slots the failure surfaces while the window's later experts are still to be read (they are
    released unread, not left loading: the run again would wait on them forever)."""
    staging_cap(cap)
    path = Model.load(threads=1).path
    be = "cuda" if backend == "cuda" else "cpu-backend"
    ref_model = Model.load(path, backend=be, threads=2)
    toks = fresh_rng().integers(0, ref_model.n_vocab, 20).tolist()
    ref = ref_model.session(n_ctx=64, backend=backend)
    ref.run(toks[:12])
    ref.commit(12)
    want = np.asarray(ref.run(toks[12:16])).copy()
    m = streamed(path, least_mib(path), backend, expert_source="file", prefetch=False)
    s = m.session(n_ctx=64, backend=backend)
    s.run(toks[:12])
    s.commit(12)
    m._inject_io_fault(kind)
    with pytest.raises(RuntimeError, match=match) as ei:
        s.run(toks[12:16])  # a verify window: committed state untouched, so it can be run again as is
    msg = str(ei.value)
    assert str(path) in msg and "_exps.weight" in msg and "expert " in msg and "layer " in msg and "file bytes" in msg
    got = np.asarray(s.run(toks[12:16]))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    st = m.expert_stats()
    assert st["read_errors"] == 1 and st["lookups"] == st["hits"] + st["hits_inflight"] + st["sync_misses"]


def test_prefetch_off_copies_only_misses(backend):
    path = Model.load(threads=1).path
    m = streamed(path, least_mib(path) + 1, backend, prefetch=False)
    windows_equal(m, backend, fresh_rng(), n_windows=4, label="prefetch off")
    s = m.expert_stats()
    check_counters(s)
    assert s["prefetch"] == "off" and s["prefetch_issued"] == 0 and s["experts_read"] == s["sync_misses"] > 0


def test_budgets_and_options_are_checked(tiny_q8_model):
    path = tiny_q8_model.path
    with pytest.raises(ValueError, match=f"cache_mib=0: {path}.* needs at least [0-9]+ MiB of backend memory"):
        Model.load(path, cache_mib=0, backend="cpu-backend")
    with pytest.raises(ValueError, match="routing='approximate' with backend='cpu-backend'"):
        Model.load(path, cache_mib=8, backend="cpu-backend", routing="approximate")
    with pytest.raises(ValueError, match="expert_source='disk': expected 'auto', 'host' or 'file'"):
        Model.load(path, cache_mib=8, backend="cpu-backend", expert_source="disk")
    # auto: pinned host memory when every expert fits with room to spare (a tiny model here)
    assert Model.load(path, cache_mib=8, backend="cpu-backend").expert_stats()["source"] == "host"
    assert Model.load(path, cache_mib=8, backend="cpu-backend", expert_source="file").expert_stats()["source"] == "file"
    m = Model.load(path, cache_mib=8, backend="cpu-backend")
    s = m.expert_stats()  # before any session: the geometry, no counts
    assert m.streaming and s["where"] == "backend" and s["slots"] > 0 and s["lookups"] == 0
    # a native session of that model keeps every expert in the mapping: the same logits as the backend's
    toks = fresh_rng().integers(0, m.n_vocab, 9).tolist()
    a = np.asarray(m.session(backend="cpu").run(toks))
    b = np.asarray(m.session(backend="cpu-backend").run(toks))
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_cli_expert_source(tmp_path, capsys):
    """generate's --expert-source reaches Model.load: the stats name the source, the text is the resident model's."""
    import json

    from strata_py.generate import main
    path = Model.load(threads=1).path
    args = ["--backend", "cpu-backend", "-n", "12", "--temperature", "0", "--json", "def f(x):"]
    assert main(args) == 0
    want = json.loads(capsys.readouterr().out)["text"]
    for source in ("host", "file"):
        out = tmp_path / f"{source}.json"
        assert main(["--cache-mib", str(least_mib(path) + 1), "--expert-source", source, "--stats-json", str(out)]
                    + args) == 0
        assert json.loads(capsys.readouterr().out)["text"] == want
        sd = json.loads(out.read_text())
        assert sd["experts"]["source"] == source and sd["experts"]["lookups"] > 0
    with pytest.raises(SystemExit):
        main(["--cache-mib", "8", "--expert-source", "disk"] + args)
