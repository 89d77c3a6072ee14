"""Files written by llama.cpp itself, in CI without llama.cpp (issue 21): tests/data/llamacpp/ holds small GGUFs
made by llama.cpp's own converter (Q8_0, the current DeltaNet layout of qwen3next and the split layout of
qwen35moe, MTP blocks included) and quantizer (Q4_K_M, IQ4_XS, MXFP4_MOE), with transformers' logits on each
file's own weights; tools/make_llamacpp_fixtures.py regenerates them where llama.cpp and llama-cpp-python are
installed. Each loads, matches its reference, keeps windows equal to serial decoding and drafts exactly."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

import exactness
from kquant import act_block, q8_reference
from strata_py import _core
from strata_py.model import Model
from window_util import assert_windows_equal_serial

DATA = Path(__file__).resolve().parent / "data" / "llamacpp"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
LAYOUT = {"qwen3next": "current", "qwen3next-wide": "current", "qwen35moe": "split"}


def test_the_fixtures_are_llamacpps():
    """What the manifest says is in the files: the quantizer's file type and its tensor types (K and IQ types
    on the wide model), the converter's MTP block; a few MB in all."""
    total = 0
    for name, m in MANIFEST.items():
        path = DATA / f"{name}.gguf"
        r = gguf.GGUFReader(str(path))
        types = {}
        for t in r.tensors:
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        assert types == m["tensor_types"], name
        assert any(".nextn." in t.name for t in r.tensors), name  # the converter's MTP block
        f = r.fields["general.file_type"]
        ftype = int(f.parts[f.data[0]][0])
        if m["quantizer_ftype"]:
            assert ftype == gguf.LlamaFileType[f"MOSTLY_{m['quantizer_ftype']}"].value, name
        total += path.stat().st_size
    assert {"Q4_K", "Q6_K", "IQ4_XS", "MXFP4", "Q8_0"} <= {t for m in MANIFEST.values() for t in m["tensor_types"]}
    assert total < 6 << 20


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_llamacpp_fixture_matches_transformers(name):
    m = MANIFEST[name]
    model = Model.load(DATA / f"{name}.gguf", threads=2)
    assert model._core.dn_layout == LAYOUT[m["arch"]] and model.has_mtp
    ref = np.load(DATA / f"{name}.npz")
    ids, want = ref["ids"].tolist(), ref["logits"]
    got = model.session(n_ctx=64).run(ids)
    rel = np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)
    if m["tolerance"] == "float":  # float activations: the file's weights, exactly
        assert rel.max() <= 1e-4, (name, rel.max())
    else:
        # int8 activations (K / IQ types per 256 values; MXFP4, Q4_0, Q5_0, IQ4_NL per 32): on a random tiny model
        # their rounding flips expert choices (median 0.08-0.14, max 0.36-0.71 relative for the K / IQ mixes when
        # this was written; the MXFP4_MOE file's experts median 0.020, max 0.29; a misread block layout gives ~1).
        # The exact checks are per tensor: test_llamacpp_blocks_read_exactly.
        assert np.median(rel) <= 0.15, (name, np.median(rel), rel.max())
    assert_windows_equal_serial(model, windows=(3, 9), label=name)
    block = ids[:7]
    exactness.assert_equals_plain(model, block * 3, exactness.config("sampled", 1, 16), ["suffix", "mtp"], label=name)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_llamacpp_blocks_read_exactly(name):
    """Every quantized tensor of llama.cpp's file dequantizes bit-exactly as gguf-py's reference does, and one
    matrix of each type multiplies as the float64 product with the kernel's stated activation quantization
    (int8 types; kquant.q8_reference) or with the float activations, up to float32 rounding."""
    r = gguf.GGUFReader(str(DATA / f"{name}.gguf"))
    seen = set()
    rng = np.random.default_rng(8)
    for t in r.tensors:
        typ = t.tensor_type.name
        if typ in ("F32", "F16"):
            continue
        cols, rows = int(t.shape[0]), int(np.prod([int(x) for x in t.shape[1:]]))
        raw = np.ascontiguousarray(np.asarray(t.data)).view(np.uint8).ravel()
        W = gguf.quants.dequantize(raw.reshape(rows, -1), t.tensor_type)
        np.testing.assert_array_equal(_core.dequantize(raw, typ, rows * cols).reshape(rows, cols), W, err_msg=t.name)
        if typ in seen:
            continue
        seen.add(typ)
        x = rng.standard_normal((3, cols)).astype(np.float32)
        y = _core.matmul(raw, typ, rows, cols, x)
        block = act_block(typ)  # matmul.h: float, 256- or 32-block int8 activations
        xr = q8_reference(x, block)[0] if block else x.astype(np.float64)
        want = xr @ W.astype(np.float64).T
        scale = np.abs(xr) @ np.abs(W.astype(np.float64)).T
        assert np.all(np.abs(y - want) <= 1e-5 * scale + 1e-30), (name, t.name, typ)
    assert seen
