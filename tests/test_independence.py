"""Outputs do not depend on the machine's parallelism (engine spec 2.5: a fixed thread partition) or on other
work in the process (issue 21): logits and generations bit-identical for 1, 2 and 3 threads, greedy and sampled,
with drafting and with experts streaming from disk; two to four sessions of one model driven from Python
threads at once each give their serial output, and the shared pieces (the model's thread pool, its expert cache,
the global suffix index, the window-cost table) stay consistent."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import exactness
from strata_py import synth
from strata_py.controller import window_costs
from strata_py.drafting import suffix as sfx
from strata_py.generate import generate_ids
from strata_py.model import Model
from strata_py.speculative import LoopStats


@pytest.fixture(scope="module")
def e16(tmp_path_factory):
    """A tiny q8_0 model with an MTP block and 16 experts (top-4), and its smallest legal expert cache."""
    synth.SIZES.setdefault("tiny-e16", dict(synth.SIZES["tiny"], n_expert=16, n_expert_used=4))
    path = synth.write("tiny-e16", tmp_path_factory.mktemp("indep") / "e16.gguf", "q8_0", seed=11, mtp=True)
    with pytest.raises(ValueError, match="needs at least") as ei:
        Model.load(path, threads=1, cache_mib=0)
    return path, int(str(ei.value).split("needs at least ")[1].split(" MiB")[0])


def _trace(model, toks):
    s = model.session(n_ctx=96, max_window=8)
    out = [s.run(toks[:17]).copy()]
    s.commit(17)
    for T, keep in ((1, 1), (8, 3), (5, 5), (2, 1)):
        i = len(s.tokens)
        out.append(s.run(toks[i:i + T]).copy())
        s.commit(keep)
    return out


def test_outputs_identical_for_1_2_3_threads(e16):
    path, lo = e16
    ref = Model.load(path, threads=1)
    rng = np.random.default_rng(17)
    toks = rng.integers(0, ref.n_vocab, 40).tolist()
    block = rng.integers(0, ref.n_vocab, 6).tolist()
    want = _trace(ref, toks)
    cases = exactness.cases(seeds=(5,), max_tokens=16)
    plains = {label: exactness.plain(ref, block * 3, cfg) for label, cfg in cases}
    for threads, cache_mib in ((1, lo), (2, -1), (2, lo), (3, -1), (3, lo)):  # (1, -1) is the reference
        m = Model.load(path, threads=threads, cache_mib=None if cache_mib < 0 else cache_mib)
        assert m.threads == threads and m.streaming == (cache_mib >= 0)
        for i, (a, b) in enumerate(zip(want, _trace(m, toks))):
            np.testing.assert_array_equal(a, b, err_msg=f"threads={threads} cache_mib={cache_mib} window {i}")
        for label, cfg in cases:
            exactness.assert_equals_plain(m, block * 3, cfg, ["none", "mtp+suffix", exactness.Adversarial(3)],
                                          reference=plains[label], label=f"{label} threads={threads} cache={cache_mib}")


def test_concurrent_sessions_give_their_serial_outputs(e16):
    """Four Python threads each run requests on their own session of one model (streaming experts; suffix with
    the global index, auto with the shared window-cost table, MTP, plain) at the same time."""
    path, lo = e16
    m = Model.load(path, threads=2, cache_mib=lo + 1)
    rng = np.random.default_rng(23)
    jobs = []
    for k, draft in enumerate(("suffix", "auto", "mtp", "none")):
        block = rng.integers(0, m.n_vocab, 5 + k).tolist()
        mode = "sampled" if k % 2 else "greedy"
        jobs.append((block * 3, exactness.config(mode, k, 28, draft=draft, extra={"global_index_tokens": 4096})))
    sfx._GLOBAL.clear()
    serial = [exactness.plain(m, p, c) for p, c in jobs]
    costs = window_costs(m)
    samples0 = costs.samples
    got: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    def work(k):
        try:
            prompt, cfg = jobs[k]
            barrier.wait()
            for _ in range(3):  # later rounds draft from the global index that the others fill
                st = LoopStats()
                out = list(generate_ids(m, prompt, cfg, stats=st))
                got.setdefault(k, []).append((out, st))
        except BaseException as e:  # noqa: BLE001 (re-raised in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    for k, runs in got.items():
        assert len(runs) == 3
        for out, st in runs:
            assert out == serial[k], (k, jobs[k][1].draft)
    assert sum(st.drafted for runs in got.values() for _, st in runs) > 0
    # the shared pieces: every sequence in the global index is one request's (none torn), within its budget; the window-cost table got samples; the expert cache's counters add up with no read error
    held = [seq for g in sfx._GLOBAL.values() for seq in g.sequences()]
    assert held and all(g.size_tokens <= g.capacity for g in sfx._GLOBAL.values())
    whole = [jobs[k][0] + serial[k] for k in range(len(jobs))]  # a request's prompt + output
    for seq in held:  # the output as its drafter indexed it: a contiguous run of one request's tokens
        L = len(seq)
        assert any(list(seq) == w[i:i + L] for w in whole for i in range(len(w) - L + 1)), seq[:8]
    assert costs.samples > samples0
    es = m.expert_stats()
    assert es["read_errors"] == 0 and es["sync_misses"] + es["hits"] + es["hits_inflight"] == es["lookups"]
    sfx._GLOBAL.clear()
