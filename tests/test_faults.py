"""Faults around a loaded model: the file truncated, rewritten or replaced while mapped (a clear error, never
SIGBUS: gguf/map_guard.h and Model::check_files), and memory budgets far above RAM (an error at load, not a
kill by the OOM killer later: util/memory.h)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from corrupt import rewrite, sparse_experts
from strata_py.model import Model


@pytest.fixture
def copy(tiny_gguf, tmp_path):
    p = tmp_path / "copy.gguf"
    shutil.copy(tiny_gguf, p)
    return p


def _py(code: str, *args, timeout=120) -> subprocess.CompletedProcess:
    """A fresh interpreter: a SIGBUS there kills only it (returncode -7), never the test process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def test_truncated_before_a_run(copy, tiny_model):
    m = Model.load(copy, threads=2)
    s = m.session(n_ctx=32)
    want = tiny_model.session(n_ctx=32).run([1, 2, 3])
    np.testing.assert_array_equal(s.run([1, 2, 3]), want)
    s.commit(3)
    size = copy.stat().st_size
    os.truncate(copy, size // 2)
    with pytest.raises(RuntimeError, match=str(copy).replace(".", r"\.") + r": the model file changed since it was "
                       rf"loaded \(its size changed from {size} to {size // 2} bytes\); .* Reload the model"):
        s.run([4])
    assert s.position == 3  # refused before anything ran: the session is as it was


def test_truncated_while_mapped_reads_zeros_not_sigbus(copy):
    """Reading pages past the new end of a truncated mapping raises SIGBUS; the guard maps zeros there instead
    and check_files() raises. In a subprocess, so that a regression kills only that."""
    r = _py("""
        import os, sys
        from strata_py.model import Model
        p = sys.argv[1]
        m = Model.load(p, threads=1)
        m._core._touch_mapping()                   # intact: every page readable
        os.truncate(p, 4096)
        try:
            m._core._touch_mapping()               # faults on every page past 4096
        except RuntimeError as e:
            print("REFUSED", e)
        try:
            m.session(n_ctx=16).run([1])
        except RuntimeError as e:
            print("RUN", e)
        """, copy)
    assert r.returncode == 0, f"returncode {r.returncode}: {r.stderr[-2000:]}"
    assert f"REFUSED {copy}: the model file changed since it was loaded (it was truncated while mapped: a read past " \
           "its new end returned zeros)" in r.stdout
    assert f"RUN {copy}: the model file changed" in r.stdout


def test_truncated_during_runs(copy):
    """A truncation at an arbitrary moment while windows run on another thread: every outcome is either a
    window that finished before it or a RuntimeError naming the file; the process survives."""
    r = _py("""
        import os, sys, threading, time
        from strata_py.model import Model
        p = sys.argv[1]
        m = Model.load(p, threads=2)
        s = m.session(n_ctx=4096)
        s.run(list(range(1, 65))); s.commit(64)
        errors = []
        done = threading.Event()
        def cut():
            time.sleep(0.05)
            os.truncate(p, os.path.getsize(p) // 3)
            done.set()
        t = threading.Thread(target=cut); t.start()
        after = 0  # windows started after the truncation: the first must fail, however slow the machine
        while after < 20:
            after += done.is_set()
            if s.position + 40 > s.n_ctx:
                s.reset()
            try:
                s.run([s.position % 300 + 1] * 40)  # prompt windows: DeltaNet state updated in place
                s.commit(40)
            except RuntimeError as e:
                errors.append(str(e))
                break
        t.join()
        print("ERRORS", len(errors), errors[:1])
        """, copy)
    assert r.returncode == 0, f"returncode {r.returncode}: {r.stderr[-2000:]}"
    assert "ERRORS 1" in r.stdout and str(copy) in r.stdout and "changed since it was loaded" in r.stdout


def test_rewritten_in_place_and_replaced(copy, tiny_gguf, tiny_q8_gguf, tiny_model):
    """Same size, new bytes (a new mtime): refused. Replaced by rename: the mapping still holds the file that
    was loaded (its inode lives on), so the model keeps giving exactly its old output."""
    m = Model.load(copy, threads=2)
    want = tiny_model.session(n_ctx=32).run([5, 6])
    st = os.stat(copy)
    with open(copy, "r+b") as f:
        f.seek(st.st_size - 64)
        f.write(b"\x7f" * 64)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(RuntimeError, match=r"changed since it was loaded \(it was modified\)"):
        m.session(n_ctx=32).run([5, 6])
    shutil.copy(tiny_gguf, copy.with_name("a.gguf"))
    m2 = Model.load(copy.with_name("a.gguf"), threads=2)
    shutil.copy(tiny_q8_gguf, copy.with_name("b.gguf"))
    os.replace(copy.with_name("b.gguf"), copy.with_name("a.gguf"))
    np.testing.assert_array_equal(m2.session(n_ctx=32).run([5, 6]), want)


def test_expert_cache_far_above_ram(tiny_gguf, tmp_path):
    """A model with 768 GiB of experts (a sparse file: holes, no disk) loads mapped; a cache budget far above
    RAM is refused at load with the sizes named, before anything is allocated."""
    p = sparse_experts(tiny_gguf, tmp_path / "huge.gguf", n_expert=1024, n_ff_exp=65536)
    m = Model.load(p, threads=2)
    assert m.config["n_expert"] == 1024 and not m.streaming
    with pytest.raises(ValueError, match=r"bad option cache_mib=1000000000: an expert cache of 4096 slots of 201338880 "
                                         r"bytes needs 786480 MiB but this machine has \d+ MiB of memory"):
        Model.load(p, threads=2, cache_mib=10**9)


def test_context_far_above_ram(tiny_gguf, tmp_path):
    """A file that claims a 64M-token context: a session that asks for it is refused before any allocation."""
    if os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") > 48 << 30:
        pytest.skip("this machine has more memory than the 64 GiB session would need: it would be allocated")
    p = rewrite(tiny_gguf, tmp_path / "ctx.gguf", set_kv=("qwen3next.context_length", 1 << 26))
    m = Model.load(p, threads=2)
    with pytest.raises(ValueError, match=r"a session with n_ctx=67108864 \(KV cache and DeltaNet state\) needs \d+ MiB "
                                         r"but this machine has \d+ MiB of memory"):
        m.session(n_ctx=1 << 26)
    assert m.session(n_ctx=64).run([1]).shape == (1, m.n_vocab)
