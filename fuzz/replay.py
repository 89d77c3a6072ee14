"""Replays fuzz inputs against the normal build, doing what each harness does with them (fuzz/fuzz_*.cpp,
fuzz/fuzz_python.py), and prints one line per input: `OK`, `REFUSED` (a ValueError / RuntimeError naming the
file) or `BUG` (any other exception). A crash ends the process: the last `FILE` line names the input.

    python fuzz/replay.py {gguf|checkpoint|python} BASE_MODEL[,BASE_MODEL...] INPUT...   (tests/test_fuzz_corpus.py)
"""
from __future__ import annotations

import sys
import traceback

import numpy as np

from strata_py import _core
from strata_py.model import Model

REFUSALS = (ValueError, RuntimeError, FileNotFoundError)
SESSION_BUDGET = 256 << 20  # fuzz_util.h kSessionBudget


def model_for(cp: bytes, models: list) -> Model:
    """The model whose fingerprint a checkpoint's header (bytes 16..24) names, else the first (as
    fuzz_checkpoint.cpp chooses)."""
    fp = int.from_bytes(cp[16:24], "little") if len(cp) >= 24 else None
    return next((m for m in models if m._core.fingerprint == fp), models[0])


def _session(m: "_core.Model", mtp: bool) -> None:
    n_ctx = min(16, m.config["n_ctx_train"])
    if n_ctx < 4 or _core.session_state_bytes(m, n_ctx, 4, mtp) > SESSION_BUDGET:
        return
    s = _core.Session(m, n_ctx, 4, "lazy", mtp)
    V = m.config["n_vocab"]
    s.run(np.array([0, 1 % V, 2 % V], dtype=np.int32), False)
    s.commit(2)
    s.run(np.array([2 % V], dtype=np.int32), False)
    s.commit(1)
    if mtp:
        s.mtp_draft(0, 2)
    s.checkpoint()


def gguf(path: str, size: int) -> None:
    """fuzz_gguf.cpp, through the same C++ entry points (no tokenizer): load (streamed experts for odd sizes,
    falling back to resident), a short session, and the MTP block, also as a separate MTP-only file."""
    def load(cache_mib: int, mtp_path: str = "") -> "_core.Model":
        return _core.Model.load(path, 1, mtp_path, cache_mib, False, 1, bool(size & 2))
    try:
        m = load(1 if size & 1 else -1)
    except ValueError:
        m = load(-1)
    _session(m, False)
    if m.has_mtp:
        _session(m, True)
        _session(load(-1, path), True)


def checkpoint(path: str, models: list) -> None:
    """fuzz_checkpoint.cpp: Session.load for the model the header names, one step."""
    s = model_for(open(path, "rb").read(64), models).load_session(path, n_ctx=64, max_window=4)
    if s.position < s.n_ctx:
        s.run([1])
        s.commit(1)


def python(path: str, models: list, tmp: str) -> None:
    """fuzz_python.py: byte 0 picks the target, the rest is the file."""
    data = open(path, "rb").read()
    if not data:
        return
    with open(tmp, "wb") as f:
        f.write(data[1:])
    if data[0] % 2 == 0:
        m = Model.load(tmp, threads=1)
        ids = m.tokenizer.encode("def f(x):\n    return x")
        m.session(n_ctx=16).run([i % m.n_vocab for i in ids[:3]] or [0])
        m.tokenizer.decode(range(min(m.n_vocab, m.tokenizer.n_vocab)))
    else:
        checkpoint(tmp, models)


def main(argv: list[str]) -> int:
    import os
    import tempfile
    kind, bases, inputs = argv[0], argv[1], argv[2:]
    models = [Model.load(b, threads=1) for b in bases.split(",")]
    tmp = os.path.join(tempfile.mkdtemp(), "input")
    for p in inputs:
        print("FILE", p, flush=True)
        try:
            if kind == "gguf":
                gguf(p, os.path.getsize(p))
            elif kind == "checkpoint":
                checkpoint(p, models)
            else:
                python(p, models, tmp)
            print("OK", p, flush=True)
        except REFUSALS as e:
            print("REFUSED", p, str(e).splitlines()[0][:200], flush=True)
        except BaseException:  # noqa: BLE001  (a bug, whatever it is)
            print("BUG", p, traceback.format_exc().replace("\n", " | "), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
