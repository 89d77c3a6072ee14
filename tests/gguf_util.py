"""GGUF helpers for tests (not a test module)."""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

# Tests import strata_py from the source tree when the package is not installed.
_PY = Path(__file__).resolve().parents[1] / "python"
if str(_PY) not in sys.path:
    sys.path.insert(0, str(_PY))


def metadata_from_gguf_reader(path) -> dict:
    """GGUF metadata as {key: value} with Python values (str / int / float / bool / list for arrays), the same
    shape `_core.gguf_metadata(path)` returns. The GGUF.* pseudo-fields of GGUFReader are left out."""
    r = path if isinstance(path, gguf.GGUFReader) else gguf.GGUFReader(path)
    md = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        v = f.contents()
        if f.types and f.types[0] == gguf.GGUFValueType.BOOL:
            v = bool(v)
        md[key] = v
    return md


def tensor_f32(reader: gguf.GGUFReader, name: str) -> np.ndarray:
    """Dequantized float32 tensor in numpy order (ggml ne reversed)."""
    t = next((t for t in reader.tensors if t.name == name), None)
    if t is None:
        raise KeyError(name)
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    return np.asarray(a, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))


def tensors_by_name(reader: gguf.GGUFReader) -> dict:
    """name -> ReaderTensor."""
    return {t.name: t for t in reader.tensors}


def read_gguf(path) -> tuple[gguf.GGUFReader, dict, dict]:
    """(reader, name -> ReaderTensor, metadata) of a GGUF file."""
    r = gguf.GGUFReader(path)
    return r, tensors_by_name(r), metadata_from_gguf_reader(r)


def f32_array(t) -> np.ndarray:
    """An F32 ReaderTensor's values in numpy order (ggml ne reversed)."""
    return np.asarray(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
