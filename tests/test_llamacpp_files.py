"""GGUFs written by llama.cpp's own converter load in strata and match transformers (qwen3next), and are the
files our converter writes (qwen35moe, qwen4exp; differences asserted where the spec says llama.cpp is wrong).

Needs a llama.cpp tree (convert_hf_to_gguf.py + conversion/ + gguf-py/), which this repository does not carry:
it is looked for at scratch/llama.cpp (git-ignored; e.g. `vendor/llama.cpp` of the llama-cpp-python sdist).
Without it the test is skipped with that reason; docs/BENCHMARKS.md records the last run."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hf_tiny import make_tiny_hf
from kquant import act_block
from strata_py.convert import convert
from strata_py.model import Model

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "scratch" / "llama.cpp"


@pytest.mark.skipif(not (LLAMA / "convert_hf_to_gguf.py").exists(),
                    reason=f"no llama.cpp converter at {LLAMA} (see the module docstring)")
@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_llamacpp_converter_output(tmp_path, outtype):
    ref_model = make_tiny_hf(tmp_path / "hf", seed=9, with_mtp=True)
    out = tmp_path / f"llamacpp-{outtype}.gguf"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "llamacpp_convert.py"), str(LLAMA), str(tmp_path / "hf"),
                        str(out), "--outtype", outtype], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    model = Model.load(out, threads=2)
    assert model.has_mtp and model._core.dn_layout == "current"
    ids = np.random.default_rng(4).integers(0, model.n_vocab, 48).tolist()
    if outtype == "f32":  # against transformers itself
        with torch.no_grad():
            ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    else:  # quantized: against our converter's file of the same type (a random tiny model's routing amplifies
        # quantization noise too much to compare with the float model)
        ref = Model.load(convert(tmp_path / "hf", tmp_path / "ours.gguf", outtype), threads=2).session(n_ctx=64).run(ids)
    ours = model.session(n_ctx=64).run(ids)
    rel = np.max(np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1))
    assert rel <= 1e-4


# ---------------------------------------------------------------------------------------------------------
# qwen35moe and qwen4exp: llama.cpp's converter and ours write the same file, except where the spec says
# llama.cpp's converter is wrong (spec qwen4exp.md 3.3) or where the difference carries no information
# ---------------------------------------------------------------------------------------------------------

needs_llama_tree = pytest.mark.skipif(not (LLAMA / "convert_hf_to_gguf.py").exists(),
                                      reason=f"no llama.cpp converter at {LLAMA} (see the module docstring)")
# cosmetic: llama.cpp names the model after the directory (title-cased) and adds a size label; we write the
# GGUF default alignment (32) explicitly
COSMETIC = {"general.name", "general.size_label", "general.alignment"}


def _llamacpp_convert(hf: Path, out: Path, *args: str) -> Path:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "llamacpp_convert.py"), str(LLAMA), str(hf), str(out),
                        *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _file(path):
    import gguf
    from gguf_util import metadata_from_gguf_reader
    r = gguf.GGUFReader(path)
    types = {k: [int(t) for t in f.types] for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return metadata_from_gguf_reader(r), types, {t.name: t for t in r.tensors}


def _assert_same_file(ours: Path, theirs: Path, expected_md_diff: dict):
    """Same tensors (names, shapes, types, bytes; ssm_a within 1 ulp: numpy's and torch's float32 exp differ)
    and the same metadata (values and value types), except COSMETIC keys and expected_md_diff
    {key: (ours, llama.cpp's)}."""
    md_a, ty_a, ts_a = _file(ours)
    md_b, ty_b, ts_b = _file(theirs)
    diff = {k: (md_a.get(k), md_b.get(k)) for k in set(md_a) | set(md_b)
            if k not in COSMETIC and (md_a.get(k) != md_b.get(k) or ty_a.get(k) != ty_b.get(k))}
    assert diff == expected_md_diff
    assert set(ts_a) == set(ts_b)
    for n, a in ts_a.items():
        b = ts_b[n]
        assert list(a.shape) == list(b.shape) and a.tensor_type == b.tensor_type, n
        if n.endswith("ssm_a"):
            ulp = np.abs(np.asarray(a.data).view(np.int32).astype(np.int64) - np.asarray(b.data).view(np.int32))
            assert ulp.max() <= 1, n
        else:
            assert bytes(a.data) == bytes(b.data), n


@needs_llama_tree
def test_llamacpp_converter_qwen35moe_same_file(tmp_path):
    """Q8_0 (so the type rules are compared too; gguf-py quantizes for both), MTP block included."""
    from hf_tiny_next import make_tiny_qwen35moe
    make_tiny_qwen35moe(tmp_path / "hf", seed=4, with_mtp=True)
    theirs = _llamacpp_convert(tmp_path / "hf", tmp_path / "llamacpp.gguf", "--outtype", "q8_0")
    ours = convert(tmp_path / "hf", tmp_path / "ours.gguf", "q8_0")
    _assert_same_file(ours, theirs, {})


@needs_llama_tree
@pytest.mark.parametrize("outtype,spelling", [("f32", "indexed_attention"), ("q8_0", "full_attention")])
def test_llamacpp_converter_qwen4exp_same_file_but_its_two_bugs(tmp_path, outtype, spelling):
    """llama.cpp's converter writes every compress ratio as 0 (it looks for `full_attention`, which transformers'
    config renames to `indexed_attention` on load, so both spellings of config.json fail; llama.cpp then runs
    dense attention) and the LAST entry of an EOS list as ple.eos_token_id (transformers' PLE uses the first)."""
    from hf_tiny_next import make_tiny_qwen4exp
    make_tiny_qwen4exp(tmp_path / "hf", seed=4, eos_token_id=[381, 0], layer_types_spelling=spelling)
    theirs = _llamacpp_convert(tmp_path / "hf", tmp_path / "llamacpp.gguf", "--outtype", outtype)
    ours = convert(tmp_path / "hf", tmp_path / "ours.gguf", outtype)
    _assert_same_file(ours, theirs, {"qwen4exp.attention.compress_ratios": ([0, 0, 0, 4], [0, 0, 0, 0]),
                                     "qwen4exp.ple.eos_token_id": (381, 0)})


# llama-cpp-python builds llama.cpp from source and is kept out of CI: the quantizer tests skip without it
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="llama-cpp-python is not installed (kept out of CI)")


def _llama_quantize(src: Path, out: Path, ftype: str) -> Path:
    """src quantized to out by llama.cpp's own llama_model_quantize (llama-cpp-python), LLAMA_FTYPE_MOSTLY_<ftype>,
    2 threads."""
    import ctypes

    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out


@needs_llama_cpp
@pytest.mark.parametrize("ftype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4_MOE", "Q4_K_M", "IQ4_XS"])
def test_llamacpp_quantizer_output(tmp_path, ftype):
    """Files quantized by llama.cpp's own llama_model_quantize (from llama-cpp-python, when installed: it is kept
    out of CI) load and match transformers run on the same dequantized weights (gguf-py's dequantizer)."""
    from strata_py.convert import gguf_to_hf
    from transformers import Qwen3NextForCausalLM
    make_tiny_hf(tmp_path / "hf", seed=3)
    src = convert(tmp_path / "hf", tmp_path / "f32.gguf", "f32")
    out = _llama_quantize(src, tmp_path / f"llamacpp-{ftype}.gguf", ftype)
    ref_model = Qwen3NextForCausalLM.from_pretrained(gguf_to_hf(out, tmp_path / "hf-back"), dtype=torch.float32).eval()
    model = Model.load(out, threads=2)
    ids = np.random.default_rng(1).integers(0, model.n_vocab, 48).tolist()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    ours = model.session(n_ctx=64).run(ids)
    rel = np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    if not any(act_block(t.tensor_type.name) for t in gguf.GGUFReader(str(out)).tensors):
        assert rel.max() <= 1e-4, rel.max()  # float activations only (F32, Q8_0): exactly those weights
    else:
        # int8 activations (this 64-wide model's Q4_K_M and IQ4_XS fall back to Q5_0 / IQ4_NL rows: 32-blocks): on a
        # random tiny model the rounding flips expert choices, as in test_llamacpp_fixtures.py (median 0.018-0.108,
        # max 0.33-0.80 when this was written; a misread block layout gives ~1); tests/test_act32_model.py checks the
        # trained model
        assert np.median(rel) <= 0.15, (np.median(rel), rel.max())


@needs_llama_cpp
@pytest.mark.parametrize("ftype", ["IQ3_S", "IQ3_M"])
def test_llamacpp_lowbit_quantizer_output(tmp_path, ftype):
    """The trained default model (rows of 256: llama.cpp's grid quants apply) quantized by llama.cpp's own
    quantizer to IQ3_S (with IQ4_NL fallbacks for the 64-wide rows) and to the IQ3_M mix (IQ3_S, Q4_K, Q5_0,
    IQ4_NL): loads and matches transformers on the dequantized weights within the int8-activation tolerances
    of tests/test_kquant_model.py (median 5e-2, max 0.25 per position). The IQ1/IQ2 types need an importance
    matrix, which llama-cpp-python cannot pass; they are checked against gguf-py's dequantizer instead."""
    import collections

    import gguf

    from strata_py.convert import gguf_to_hf
    from transformers import Qwen3NextForCausalLM
    from strata_py.model import default_model_path
    hf = gguf_to_hf(default_model_path(), tmp_path / "hf-default")  # the shipped weights, as float32
    src = convert(hf, tmp_path / "f32.gguf", "f32", mtp=False)
    out = _llama_quantize(src, tmp_path / f"llamacpp-{ftype}.gguf", ftype)
    types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors)
    assert types["IQ3_S"] > 50, types
    ref_model = Qwen3NextForCausalLM.from_pretrained(gguf_to_hf(out, tmp_path / "hf-back"), dtype=torch.float32).eval()
    model = Model.load(out, threads=2)
    ids = model.tokenizer.encode("def parse_args(argv=None):\n    parser = argparse.ArgumentParser(description=")
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    ours = model.session(n_ctx=128).run(ids)
    rel = np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    assert np.median(rel) <= 5e-2 and rel.max() <= 0.25, (np.median(rel), rel.max())


@needs_llama_tree
def test_llamacpp_qwen4exp_file_is_refused_with_the_reason(tmp_path):
    """strata refuses llama.cpp's qwen4exp file (all compress ratios 0, so its QSA layers would run dense: not the
    model) with an error naming the file, the layer and the key, and how to get a right file."""
    from hf_tiny_next import make_tiny_qwen4exp
    make_tiny_qwen4exp(tmp_path / "hf", seed=6)
    theirs = _llamacpp_convert(tmp_path / "hf", tmp_path / "llamacpp.gguf", "--outtype", "f32")
    with pytest.raises(ValueError, match=r"llamacpp.gguf: layer 3 has QSA indexer tensors .*strata_py.convert"):
        Model.load(theirs)


@needs_llama_cpp
@pytest.mark.parametrize("arch", ["qwen35moe", "qwen4exp"])
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_llamacpp_quantizer_output_next_archs(tmp_path, arch, ftype):
    """Our qwen35moe / qwen4exp files quantized by llama.cpp's own quantizer load, match transformers on the
    dequantized weights (float activations <= 1e-4; int8-activation K types within their noise) and keep windows
    equal to serial decoding."""
    from hf_tiny_next import make_tiny_qwen35moe, make_tiny_qwen4exp
    from strata_py.convert import gguf_to_hf
    from window_util import assert_windows_equal_serial
    make = make_tiny_qwen35moe if arch == "qwen35moe" else make_tiny_qwen4exp
    make(tmp_path / "hf", seed=7)
    src = convert(tmp_path / "hf", tmp_path / "f32.gguf", "f32")
    out = _llama_quantize(src, tmp_path / f"llamacpp-{ftype}.gguf", ftype)
    from transformers import AutoModelForCausalLM
    ref_model = AutoModelForCausalLM.from_pretrained(gguf_to_hf(out, tmp_path / "hf-back"), dtype=torch.float32).eval()
    model = Model.load(out, threads=2)
    ids = np.random.default_rng(1).integers(0, model.n_vocab, 48).tolist()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    ours = model.session(n_ctx=64).run(ids)
    rel = np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    if ftype == "Q8_0":
        assert rel.max() <= 1e-4, rel.max()
    else:
        # int8 activations (the 256-wide HC / PLE rows are K-quants, the 64-wide ones fall back to Q5_0 / IQ4_NL,
        # int8 per 32 values since they left float activations): on these random tiny models the rounding flips
        # expert choices, the tolerance of test_llamacpp_fixtures.py (qwen35moe median 0.075, max 0.50 when this
        # was written; a misread block layout gives ~1)
        assert np.median(rel) <= 0.15, (np.median(rel), rel.max())
    assert_windows_equal_serial(model, windows=(3, 9), label=f"{arch} {ftype}")


@needs_llama_tree
def test_llamacpp_qwen35moe_file_matches_transformers(tmp_path):
    """llama.cpp's own qwen35moe file (its converter, f32) gives transformers' logits and equal windows."""
    from hf_tiny_next import make_tiny_qwen35moe
    from window_util import assert_windows_equal_serial
    ref_model = make_tiny_qwen35moe(tmp_path / "hf", seed=8, with_mtp=True)  # its converter asserts an MTP block
    theirs = _llamacpp_convert(tmp_path / "hf", tmp_path / "llamacpp.gguf", "--outtype", "f32")
    model = Model.load(theirs, threads=2)
    ids = np.random.default_rng(2).integers(0, model.n_vocab, 48).tolist()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    ours = model.session(n_ctx=64).run(ids)
    assert np.max(np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)) <= 1e-4
    assert_windows_equal_serial(model, windows=(4, 9), label="llama.cpp qwen35moe")
