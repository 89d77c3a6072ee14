"""Tensors whose bytes are produced while gguf-py's GGUFWriter writes them, so that a GGUF larger than memory
(synth's real-dimension 80B files: 25-45 GB) is written tensor by tensor, a large tensor slice by slice,
never held whole.

GGUFWriter.add_tensor keeps the object it is given and, in write_tensors_to_file, calls its `tofile(fp)` and
checks `nbytes`; shape and dtype are read when the tensor is added. A LazyTensor has those four and nothing
else: `produce()` yields contiguous numpy arrays whose bytes, back to back, are the tensor's bytes.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np


class LazyTensor:
    def __init__(self, shape: tuple[int, ...], dtype, produce: Callable[[], Iterator[np.ndarray]]):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self._produce = produce

    def tofile(self, fp) -> None:
        written = 0
        for part in self._produce():
            part = np.ascontiguousarray(part)
            part.tofile(fp)
            written += part.nbytes
        if written != self.nbytes:  # a generator bug would otherwise shift every later tensor
            raise RuntimeError(f"lazy tensor of shape {self.shape} produced {written} bytes, expected {self.nbytes}")

    def byteswap(self, inplace: bool = False):  # GGUFWriter calls this only for a big-endian file
        raise ValueError("lazy tensors are written little-endian only")
