"""atheris harness over the Python entry points that read files: `Model.load` (the C++ load, then the
tokenizer rebuilt from `_core.gguf_metadata` by `tokenizer.py`) and `Model.load_session` (the checkpoint
reader behind `Session.load`), each followed by a little use of what loaded.

    python fuzz/fuzz_python.py -model=A.gguf [-model=B.gguf ...] [libFuzzer flags] CORPUS_DIR ...
                                                                        (tools/fuzz.sh python N)

The first input byte picks the target (even: a GGUF, odd: a checkpoint, read for the -model whose
fingerprint its header names, else the first); the rest is the file. A refusal is a ValueError / RuntimeError / FileNotFoundError naming the file; any other exception
(IndexError, KeyError, TypeError, a `tokenizers` PanicException, MemoryError, ...) is a bug, reported by
atheris as a crash with the input saved.
"""
from __future__ import annotations

import os
import sys
import tempfile

import atheris

from strata_py.model import Model  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replay import model_for  # noqa: E402  (the same choice of model as the C++ harness and the replay)

# The editable install imports strata_py through a custom loader that atheris' import hook does not see:
# instrument every loaded Python function instead (ours, and the Python parts of numpy/tokenizers).
atheris.instrument_all()

REFUSALS = (ValueError, RuntimeError, FileNotFoundError)
_dir = tempfile.mkdtemp(prefix="strata-fuzz-py-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
_models: list[Model] = []


def one_input(data: bytes) -> None:
    if not data:
        return
    path = os.path.join(_dir, "input")
    with open(path, "wb") as f:
        f.write(data[1:])
    try:
        if data[0] % 2 == 0:
            m = Model.load(path, threads=1)
            ids = m.tokenizer.encode("def f(x):\n    return x")
            s = m.session(n_ctx=16)
            s.run([i % m.n_vocab for i in ids[:3]] or [0])
            m.tokenizer.decode(range(min(m.n_vocab, m.tokenizer.n_vocab)))
        else:
            s = model_for(data[1:], _models).load_session(path, n_ctx=64)
            if s.position < s.n_ctx:
                s.run([1])
    except REFUSALS:
        pass


def main() -> None:
    _models.extend(Model.load(a.split("=", 1)[1], threads=1) for a in sys.argv if a.startswith("-model="))
    if not _models:
        sys.exit("fuzz_python.py: pass -model=PATH (small GGUFs; checkpoints are read for them)")
    atheris.Setup([a for a in sys.argv if not a.startswith("-model=")], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
