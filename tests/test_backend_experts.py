"""Routed experts streamed into a bounded cache of backend memory (csrc/model/backend_experts.h; issue 19's experts
from host memory): with Model.load(cache_mib=..., backend=B) a backend session's logits and hidden rows equal the
native session's (every expert resident in the mapping) bit for bit, for prompt windows, T = 1 steps and verify
windows with random keeps, at the least budget (long prompt windows then run their experts in groups of rows), at a
quarter of the experts and with every expert fitting; decoding (greedy, sampled, suffix-drafted) gives the native
tokens; the counters add up (every lookup a hit or a miss, every copy a miss or a prefetch, the bytes those copies
moved); a budget below one row's experts is refused at load, naming the file and the least budget. B is the CPU
backend (runs everywhere, CI included) and the GPU where one is usable (the CPU side then on its scalar kernels:
the GPU's attention is attend_ref's order)."""
from __future__ import annotations

import numpy as np
import pytest

from backend_util import decode_equal, tiny_qwen35moe, windows_equal
from seeds import fresh_rng
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


@pytest.mark.parametrize("budget", ["least", "quarter", "all"])
def test_streamed_windows_equal_resident(budget, backend):
    path = Model.load(threads=1).path
    all_mib = 64  # more than the default model's 256 experts of 52 KiB
    base = Model.load(path, cache_mib=all_mib, backend="cpu-backend").expert_stats()
    assert base["slots"] == base["experts_total"] == 256
    mib = {"least": least_mib(path), "quarter": max(least_mib(path), (base["slot_bytes"] * 64) >> 20), "all": all_mib}[budget]
    m = streamed(path, mib, backend)
    windows_equal(m, backend, fresh_rng(), n_windows=12, label=f"{budget} ({mib} MiB)")
    s = m.expert_stats()
    check_counters(s)
    assert s["union_layers"] > 0 and s["lookups"] > 0
    if budget == "all":
        assert s["evictions"] == 0 and s["experts_read"] <= s["experts_total"]
    else:
        assert s["evictions"] > 0
    m.reset_expert_stats()
    assert m.expert_stats()["lookups"] == 0


def test_long_prompt_in_groups_at_the_least_budget(tiny_q8_model, backend):
    """A 150-row prompt (pieces of 64 rows): at the least budget a piece's union is larger than the cache, so its
    experts run in groups of rows (degraded_groups), with the resident session's logits."""
    path = tiny_q8_model.path
    m = streamed(path, least_mib(path), backend)
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
    m = streamed(path, least_mib(path) + 1, backend)
    decode_equal(m, backend, fresh_rng(), temperature=temperature, draft=draft, label=f"streamed {draft} t={temperature}")


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
    m = Model.load(path, cache_mib=8, backend="cpu-backend")
    s = m.expert_stats()  # before any session: the geometry, no counts
    assert m.streaming and s["where"] == "backend" and s["slots"] > 0 and s["lookups"] == 0
    # a native session of that model keeps every expert in the mapping: the same logits as the backend's
    toks = fresh_rng().integers(0, m.n_vocab, 9).tolist()
    a = np.asarray(m.session(backend="cpu").run(toks))
    b = np.asarray(m.session(backend="cpu-backend").run(toks))
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
