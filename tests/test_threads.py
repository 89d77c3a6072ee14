"""The thread pool (util/threads.h): chunks claimed by whoever is free visit every index exactly once, on chunk
bounds that are multiples of the alignment; exceptions in any chunk (a worker's too) surface in the caller and
the pool stays usable; the adaptive pool runs regions on the caller alone when a worker's chunks are slow (as
when another program took its core), and its choice (util/region_modes.h) keeps the faster way on synthetic
walls; and no product depends on the thread count or on who computes what."""
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


def test_adaptive_pool_with_slow_workers_runs_every_chunk_once():
    """Chunks of 50 us whose worker copies first sleep 3 ms: whichever way the adaptive pool runs each region on
    these real walls, every index is visited once per region and every region is counted one way; a fixed pool
    keeps no choice. Which way it picks is not asserted here (it depends on the machine's timing): the choice is
    tested on synthetic walls below (test_region_modes_*, test_pool_told_a_way_is_faster_uses_it)."""
    kw = dict(regions=200, slow_worker_us=3000, work_us=50)
    seen, _, serial, parallel = _core._pool_selftest(2, 4096, adaptive=True, **kw)
    assert seen == [200] * 4096 and serial + parallel == 200
    seen, _, serial, parallel = _core._pool_selftest(2, 4096, adaptive=False, **kw)
    assert seen == [200] * 4096 and serial == 0 and parallel == 0  # a fixed pool keeps no choice


def test_linger_keeps_idle_workers_polling_until_its_deadline():
    """ThreadPool::linger (the decode loop's grammar step between two forwards): an idle worker does not sleep
    before the deadline, however long the caller's own work takes, and does sleep after it. What is asserted is
    the order of events against the deadline, not a speed: a worker can sleep only once its deadline has passed,
    so the first sleep comes no sooner than linger_us after the call (and without a linger it does come)."""
    during, first = _core._pool_linger(2, linger_us=2e6, idle_us=20_000, wait_s=0.2)
    assert during == 0 and first == -1  # 20 ms of the caller's work and 180 ms more: still polling
    during, first = _core._pool_linger(2, linger_us=30_000, idle_us=0)
    assert first >= 30_000
    during, first = _core._pool_linger(2, linger_us=0, idle_us=0)
    assert first > 0  # without it the worker sleeps (the counter the two cases above read works)


# The adaptive choice (util/region_modes.h) on synthetic walls: nothing below is timed. A block closes when its
# walls add up to RegionModes::kBlockUs (8 ms), so 100 us regions make blocks of 80.

def _sim(regions):
    serial, tried, blocks = _core._region_modes_sim(regions)
    return np.array(serial), tried, blocks


@pytest.mark.parametrize("par_us,ser_us", [(200.0, 100.0), (100.0, 200.0), (100.0, 130.0), (130.0, 100.0)])
def test_region_modes_keeps_the_faster_way_and_still_tries_the_other(par_us, ser_us):
    serial, tried, blocks = _sim([(7, par_us, ser_us)] * 40000)
    faster_serial = ser_us < par_us
    after_warmup = serial[2000:] == faster_serial  # 4 warm-up blocks of at most 80 regions
    assert after_warmup.mean() > 0.9, after_warmup.mean()
    assert 0 < tried < 0.2 * len(serial) and blocks > 300
    # trying costs about RegionModes::kTryCost of the time at any gap, never the gap itself
    cost = (np.where(serial, ser_us, par_us).sum() / (min(par_us, ser_us) * len(serial))) - 1
    assert cost < 0.05, cost


def test_region_modes_follows_a_change_of_load():
    """Parallel faster, then (another program takes a core) parallel 3x slower, then faster again: the choice
    follows within a few hundred regions each time."""
    phase = [(7, 100.0, 200.0)] * 10000 + [(7, 600.0, 200.0)] * 10000 + [(7, 100.0, 200.0)] * 10000
    serial, _, _ = _sim(phase)
    assert (~serial[8000:10000]).mean() > 0.9
    assert serial[12000:20000].mean() > 0.9
    assert (~serial[24000:30000]).mean() > 0.9


def test_region_modes_decides_each_size_class_on_its_own():
    """A decode step's small regions (20 us, faster serially) among a prompt window's large ones (2 ms, twice
    as fast in parallel): each class of size keeps its own way."""
    small, large = (11, 40.0, 20.0), (12, 2000.0, 4000.0)
    serial, _, _ = _sim(([small] * 20 + [large]) * 3000)
    kinds = np.array(([0] * 20 + [1]) * 3000)
    late = np.arange(len(kinds)) > len(kinds) // 4
    assert serial[late & (kinds == 0)].mean() > 0.9
    assert (~serial[late & (kinds == 1)]).mean() > 0.9


def test_region_modes_weighs_a_stall_by_its_time():
    """Serially 100 us with one region in 100 (at random) stalled for 8 ms, a time slice lost: the serial mean
    is 180 us. Against 250 us in parallel the caller alone is faster; against 150 us parallel is, although the
    typical serial region is faster still. A block cut short by a stall counts as its time (a mean of the
    blocks' ratios would make the stalled blocks, being short, weigh as much as the rest)."""
    stall = np.random.default_rng(5).random(40000) < 0.01
    for par_us, want_serial in ((250.0, True), (150.0, False)):
        serial, _, _ = _sim([(7, par_us, 8000.0 if st else 100.0) for st in stall])
        assert (serial[4000:] == want_serial).mean() > 0.85, (par_us, serial[4000:].mean())


@pytest.mark.parametrize("serial_faster", [True, False])
def test_pool_told_a_way_is_faster_uses_it(serial_faster):
    """An adaptive pool whose RegionModes were fed walls saying one way is faster runs its real regions that
    way (serially: no chunk on a worker)."""
    par, ser = (1000.0, 1.0) if serial_faster else (1.0, 1000.0)
    by_workers, serial, parallel = _core._pool_told(2, 64, par, ser, told=40000, regions=50)
    if serial_faster:
        assert serial == 50 and parallel == 0 and by_workers == 0
    else:
        assert parallel == 50 and serial == 0


def test_wide_scope_runs_every_region_on_the_pool_unmeasured():
    """Inside a ThreadPool::Wide scope (a prompt window) an adaptive pool told that serial is faster neither
    decides nor measures its regions (they take the pool's path; whether a worker gets a chunk is the scheduler's
    business, not asserted); the same regions outside the scope run serially, every one (as in
    test_pool_told_a_way_is_faster_uses_it: empty chunks, so no wall of the machine's moves the choice)."""
    _, serial, parallel = _core._pool_told(2, 64, 1000.0, 1.0, told=40000, regions=30, wide=True)
    assert serial == 0 and parallel == 0
    by_workers, serial, parallel = _core._pool_told(2, 64, 1000.0, 1.0, told=40000, regions=30)
    assert serial == 30 and parallel == 0 and by_workers == 0


def test_prompt_windows_bypass_the_adaptive_choice(tiny_gguf):
    """Session.run opens the Wide scope for a prompt window (T > max_window) only: its regions leave the adaptive
    pool's counts unchanged, a T = 1 step's and a verify window's regions are counted."""
    from strata_py.model import Model
    m = Model.load(tiny_gguf)
    if m.threads < 2:
        pytest.skip("the default thread count here is 1: no region reaches the pool")
    s = m.session(n_ctx=256, max_window=8)
    counted = lambda: (lambda d: d["parallel_regions"] + d["serial_regions"])(m.pool_stats())
    c0 = counted()
    s.run(list(range(1, 41)))
    s.commit(40)
    assert counted() == c0
    s.run([5])
    s.commit(1)
    c1 = counted()
    assert c1 > c0
    s.run([1, 2, 3, 4])
    s.commit(2)
    assert counted() > c1


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
