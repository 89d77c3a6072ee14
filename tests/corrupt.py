"""Writers of broken GGUFs for the bad-input tests: copies of a real file with one thing changed."""
from __future__ import annotations

import os
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


def write_value(w: gguf.GGUFWriter, name: str, v, f=None) -> None:
    """Write key `name` = v: str/bytes as a string, float as FLOAT32, int with the original field's type when it
    fits (else UINT64), a list as an array of its first element's kind."""
    VT = gguf.GGUFValueType
    if isinstance(v, list):
        sub = VT.STRING if isinstance(v[0], str) else VT.FLOAT32 if isinstance(v[0], float) else VT.INT32
        w.add_key_value(name, v, VT.ARRAY, sub_type=sub)
    elif isinstance(v, (str, bytes)):
        w.add_key_value(name, v, VT.STRING)
    elif isinstance(v, float):
        w.add_key_value(name, v, VT.FLOAT32)
    else:
        vt = f.types[0] if f is not None and f.types[0] in (VT.UINT32, VT.INT32) and 0 <= v < 2**31 else VT.UINT64
        w.add_key_value(name, v, vt)


def rewrite(src: Path, dst: Path, *, drop: str | None = None, reshape: tuple[str, tuple] | None = None,
            set_kv: tuple[str, object] | None = None, drop_kv: str | None = None,
            set_value: tuple | None = None) -> Path:
    """Copy src to dst through gguf's reader/writer, dropping or reshaping one tensor or changing one key
    (set_kv: (key, value), written by write_value, added if absent; set_value: (key, value, GGUFValueType[, array
    element type]), added if absent)."""
    r = gguf.GGUFReader(str(src))
    arch = str(r.fields["general.architecture"].contents())
    if set_kv and set_kv[0] == "general.architecture":
        arch = set_kv[1]
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_kv:
            continue
        if set_kv and name == set_kv[0]:
            write_value(w, name, set_kv[1], f)
            continue
        if set_value and name == set_value[0]:
            continue
        copy_field(w, name, f)
    if set_kv and set_kv[0] not in r.fields and set_kv[0] != "general.architecture":
        write_value(w, *set_kv)
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


# ---------------------------------------------------------------------------------------------------------
# Hand-made GGUFs, written byte by byte (no gguf-py), so that any count, length, type or offset can be wrong:
# the malformed files of llama.cpp's tests/test-gguf.cpp and of the GGUF CVEs (tests/test_bad_input.py).

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
GGML_F32, GGML_Q8_0, GGML_I8 = 0, 8, 24


def u64(v: int) -> bytes:
    return struct.pack("<Q", v & (2**64 - 1))


def i64(v: int) -> bytes:
    return struct.pack("<q", v)


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 length (or a wrong `length`) + the bytes."""
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b) if length is None else length) + b


class Handmade:
    """header, metadata and tensor table as raw records, then the data section.

    kv(key, type, payload) appends a record whose value bytes are `payload` as given; tensor(name, ne, type,
    offset) appends a tensor-info record. build() writes magic, version, the counts (or the wrong ones given),
    the records, padding to `alignment` and `data`."""

    def __init__(self, *, magic: bytes = b"GGUF", version: int = 3):
        self.magic, self.version = magic, version
        self.kvs: list[bytes] = []
        self.tensors: list[bytes] = []
        self.data = b""

    def kv(self, key: str | bytes, vtype: int, payload: bytes, *, key_len: int | None = None) -> "Handmade":
        self.kvs.append(gstr(key, key_len) + u32(vtype) + payload)
        return self

    def kv_u32(self, key: str, v: int) -> "Handmade":
        return self.kv(key, U32, u32(v))

    def kv_str(self, key: str, s: str | bytes) -> "Handmade":
        return self.kv(key, STRING, gstr(s))

    def kv_array(self, key: str, etype: int, n: int, elems: bytes) -> "Handmade":
        return self.kv(key, ARRAY, u32(etype) + u64(n) + elems)

    def tensor(self, name: str | bytes, ne, ttype: int = GGML_F32, offset: int = 0, *, name_len: int | None = None,
               n_dims: int | None = None) -> "Handmade":
        self.tensors.append(gstr(name, name_len) + u32(len(ne) if n_dims is None else n_dims)
                            + b"".join(i64(v) for v in ne) + u32(ttype) + u64(offset))
        return self

    def build(self, *, n_tensors: int | None = None, n_kv: int | None = None, alignment: int = 32) -> bytes:
        b = (self.magic + u32(self.version) + u64(len(self.tensors) if n_tensors is None else n_tensors)
             + u64(len(self.kvs) if n_kv is None else n_kv) + b"".join(self.kvs) + b"".join(self.tensors))
        b += b"\0" * (-len(b) % alignment)
        return b + self.data

    def write(self, path: Path, **kw) -> Path:
        path.write_bytes(self.build(**kw))
        return path


def tensor_record_offset(path: Path, name: str) -> int:
    """Byte offset of the tensor-info record of `name` (its name-length field)."""
    r = gguf.GGUFReader(str(path))
    return int(next(t for t in r.tensors if t.name == name).field.offset)


def sparse_experts(src: Path, dst: Path, n_expert: int, n_ff_exp: int) -> Path:
    """src with expert_count / expert_feed_forward_length changed and the routed-expert tensors resized to
    match, their data left as holes of a sparse file (no disk, no memory): a model far larger than RAM."""
    r = gguf.GGUFReader(str(src))
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.expert_count":
            w.add_uint32(name, n_expert)
        elif name == f"{arch}.expert_feed_forward_length":
            w.add_uint32(name, n_ff_exp)
        else:
            copy_field(w, name, f)
    real: dict[str, bytes] = {}  # the tensors with data; every other one is a hole
    sizes = []
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        qt = gguf.GGMLQuantizationType(t.tensor_type)
        if t.name.endswith("_exps.weight"):
            ne = [ne[0], n_ff_exp, n_expert] if "down" not in t.name else [n_ff_exp, ne[1], n_expert]
        elif t.name.endswith("ffn_gate_inp.weight"):
            ne = [ne[0], n_expert]
            real[t.name] = np.zeros(ne[0] * n_expert, dtype=np.float32).tobytes()
        else:
            real[t.name] = np.array(t.data).tobytes()
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        nbytes = ne[0] // bs * ts * int(np.prod(ne[1:], dtype=np.int64))
        # element shape, numpy order; a non-uint8 dtype keeps gguf-py from reading it as a byte shape
        w.add_tensor_info(t.name, list(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=qt)
        sizes.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    pad = lambda n: n + (-n % 32)  # noqa: E731  (gguf-py's layout: each tensor padded to the alignment)
    os.truncate(dst, pad(dst.stat().st_size) + sum(pad(n) for n in sizes))
    rd = gguf.GGUFReader(str(dst))
    with open(dst, "r+b") as f:
        for t in rd.tensors:
            if t.name in real:
                f.seek(int(rd.data_offset) + int(t.data_offset))
                f.write(real[t.name])
    return dst
