"""The thread pool: a static partition that visits every index once; exceptions in any chunk (including a
worker thread's) surface in the caller instead of terminating the process; the pool stays usable."""
import pytest

from strata_py import _core


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_partition_visits_every_index_once(threads):
    for n in (1, 2, 7, 100, 1001):
        assert _core._pool_selftest(threads, n) == [1] * n


@pytest.mark.parametrize("where", [0, 99])  # the caller's chunk and the last worker's chunk
def test_exception_in_a_chunk_reaches_the_caller(where):
    with pytest.raises(RuntimeError, match=f"chunk failed at {where}"):
        _core._pool_selftest(4, 100, where)
    assert _core._pool_selftest(4, 100) == [1] * 100
