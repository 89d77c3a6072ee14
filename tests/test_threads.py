"""The thread pool (util/threads.h): chunks claimed by whoever is free visit every index exactly once, on chunk
bounds that are multiples of the alignment; exceptions in any chunk (a worker's too) surface in the caller and
the pool stays usable; the adaptive pool falls back to the caller alone when a worker's chunks are slow (as
when another program took its core); and no product depends on the thread count or on who computes what."""
import gguf
import numpy as np
import pytest

from strata_py import _core, synth

_ORDER = ("scalar", "avx2", "avx512")
PATHS = _ORDER[: _ORDER.index(_core.best_isa()) + 1]


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_chunks_visit_every_index_once(threads):
    for n in (1, 2, 7, 100, 1001):
        for align in (1, 16):
            seen, misaligned, _, _ = _core._pool_selftest(threads, n, align=align, regions=20)
            assert seen == [20] * n and misaligned == 0, (n, align)


@pytest.mark.parametrize("threads", [2, 3])
def test_regions_of_changing_sizes_finish_before_returning(threads):
    """Consecutive regions with different chunk counts (as a forward's products, attention and norms are): no
    chunk may run outside its region. A worker that paired an exhausted region's claim word with the next
    region's chunk count used to run a chunk past the end, count it done for the next region, and so let that
    region return while its chunks still ran (a segfault in test_next_windows after test_mtp at low load). The
    race window is a few stores wide: this stress test guards the invariant; the suite's sequence found it."""
    n = 64
    seen, bad, _, _ = _core._pool_selftest(threads, n, regions=20000, vary=True)
    cycle = [n, n // 4, n // 2, 1]
    want = [sum(1 for r in range(20000) if i < cycle[r % 4]) for i in range(n)]
    assert bad == 0
    assert seen == want


@pytest.mark.parametrize("where", [0, 99])  # a chunk the caller is likely to claim, and the last one
def test_exception_in_a_chunk_reaches_the_caller(where):
    with pytest.raises(RuntimeError, match=f"chunk failed at {where}"):
        _core._pool_selftest(4, 100, where)
    assert _core._pool_selftest(4, 100)[0] == [1] * 100


def test_adaptive_pool_falls_back_when_workers_are_slow():
    """Chunks of 50 us whose worker copies first sleep 3 ms: parallel regions lose to the caller alone, so the
    adaptive pool falls back to running them serially (every index still once per region); a fixed pool never
    does. The decision is timed: on an overloaded machine (load 20 on 2 CPUs) a descheduled caller can make one
    measurement window look like a win, or outlast the back-off, so the adaptive pool gets three tries and the
    state at the end is not asserted."""
    kw = dict(regions=100, slow_worker_us=3000, work_us=50)
    tries = []
    for _ in range(3):
        seen, _, fallbacks, _ = _core._pool_selftest(2, 4096, adaptive=True, **kw)
        assert seen == [100] * 4096
        tries.append(fallbacks)
        if fallbacks >= 1:
            break
    assert tries[-1] >= 1, f"the adaptive pool never fell back in {len(tries)} tries"
    seen, _, fallbacks, serial = _core._pool_selftest(2, 4096, adaptive=False, **kw)
    assert seen == [100] * 4096 and fallbacks == 0 and not serial


def _raw(rng, typ, rows, cols):
    qt = gguf.GGMLQuantizationType[typ]
    return np.ascontiguousarray(synth._weight(rng, (rows, cols), qt)).view(np.uint8).ravel()


@pytest.mark.parametrize("typ", ["F32", "Q8_0", "Q4_K", "Q6_K", "IQ2_XXS", "IQ4_XS"])
def test_products_independent_of_threads_and_rows(typ):
    """A 37-row product (five kernel passes, weight rows in tiles) on 1, 2, 3 and 5 threads, on every kernel
    path: every row bit-identical to the same row multiplied alone (fresh random inputs)."""
    rng = np.random.default_rng()
    rows, cols = 333, 512
    raw = _raw(rng, typ, rows, cols)
    x = rng.standard_normal((37, cols)).astype(np.float32)
    for isa in PATHS:
        one = np.stack([_core.matmul(raw, typ, rows, cols, x[t:t + 1], isa=isa)[0] for t in range(37)])
        for threads in (1, 2, 3, 5):
            np.testing.assert_array_equal(_core.matmul(raw, typ, rows, cols, x, isa=isa, threads=threads), one,
                                          err_msg=f"{typ} {isa} threads={threads}")


def test_default_model_uses_the_adaptive_pool(tiny_gguf):
    from strata_py.model import Model
    assert Model.load(tiny_gguf).pool_stats()["adaptive"]
    assert not Model.load(tiny_gguf, threads=2).pool_stats()["adaptive"]
