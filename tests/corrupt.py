"""Writers of broken GGUFs for the bad-input tests: copies of a real file with one thing changed."""
from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np


def copy_field(w: gguf.GGUFWriter, name: str, f) -> None:
    """Copy one metadata field of a GGUFReader into a writer, keeping its value type."""
    vt = f.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1])
    else:
        w.add_key_value(name, f.contents(), vt)


def rewrite(src: Path, dst: Path, *, drop: str | None = None, reshape: tuple[str, tuple] | None = None,
            set_kv: tuple[str, str] | None = None, drop_kv: str | None = None,
            set_value: tuple | None = None) -> Path:
    """Copy src to dst through gguf's reader/writer, dropping or reshaping one tensor or changing one key
    (set_kv: a string; set_value: (key, value, GGUFValueType[, array element type]), added if absent)."""
    r = gguf.GGUFReader(str(src))
    arch = str(r.fields["general.architecture"].contents())
    if set_kv and set_kv[0] == "general.architecture":
        arch = set_kv[1]
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_kv:
            continue
        if set_kv and name == set_kv[0]:
            w.add_string(name, set_kv[1])
            continue
        if set_value and name == set_value[0]:
            continue
        copy_field(w, name, f)
    if set_value:
        w.add_key_value(set_value[0], set_value[1], set_value[2], sub_type=set_value[3] if len(set_value) > 3 else None)
    for t in r.tensors:
        if t.name == drop:
            continue
        data = np.array(t.data)
        shape = [int(x) for x in reversed(t.shape)]  # numpy order
        if reshape and t.name == reshape[0]:
            data = np.resize(data, reshape[1])
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, data.reshape(data.shape), raw_shape=shape if t.tensor_type != gguf.GGMLQuantizationType.F32 else None,
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def patch(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    b = bytearray(src.read_bytes())
    b[offset:offset + len(data)] = data
    dst.write_bytes(bytes(b))
    return dst


def first_tensor_type_offset(path: Path) -> int:
    """Byte offset of the ggml type id of the first tensor-info record."""
    r = gguf.GGUFReader(str(path))
    t = r.tensors[0]
    # ReaderField parts of a tensor info: name len, name, n_dims, dims, type, offset
    return int(t.field.offset) + sum(int(p.nbytes) for p in t.field.parts[:4])


def u32(v: int) -> bytes:
    return struct.pack("<I", v)
