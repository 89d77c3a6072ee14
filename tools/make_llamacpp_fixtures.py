"""Regenerate the llama.cpp fixtures of tests/data/llamacpp/ (issue 21): small GGUFs written by llama.cpp's OWN
converter (convert_hf_to_gguf.py) and quantizer (llama_model_quantize, from llama-cpp-python), each with
transformers' reference logits, so that CI checks strata against llama.cpp's file layout without llama.cpp.

    python tools/make_llamacpp_fixtures.py [--llama scratch/llama.cpp] [--out tests/data/llamacpp]

Needs a llama.cpp tree (convert_hf_to_gguf.py, conversion/, gguf-py/; e.g. the one vendored in the
llama-cpp-python sdist) and llama-cpp-python (import llama_cpp). Deterministic inputs: the tiny random HF models
of tests/hf_tiny.py / tests/hf_tiny_next.py with fixed seeds.

For each fixture NAME: NAME.gguf and NAME.npz (`ids` int32 [48], `logits` float32 [48, vocab]: transformers run
on the file's own weights, dequantized by gguf-py, so the reference is the model the file holds; `tol`: the
tolerance class, "float" (float activations: 1e-4) or "int8" (K/IQ types, and Q4_0 / Q5_0 / IQ4_NL / MXFP4,
quantize activations: tests/test_llamacpp_fixtures.py states the tolerance)). manifest.json lists them with their tensor types and sizes.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "python")]

# name: (architecture, HF seed, llama.cpp converter outtype, llama.cpp quantizer ftype or None, tolerance)
# "qwen3next-wide": hidden 256, so that llama.cpp's K and IQ4_XS types apply to most rows (its quantizer falls
# back to 32-value types for rows that are not a multiple of 256: the 64-wide tiny model gets no K-quant at all)
WIDE = dict(hidden_size=256, num_experts=4)
FIXTURES = {
    "qwen3next-q8_0": ("qwen3next", 3, "q8_0", None, "float"),           # the converter's own Q8_0
    "qwen3next-mxfp4_moe": ("qwen3next", 3, "f32", "MXFP4_MOE", "int8"),  # MXFP4 experts: int8 activations per 32
    "qwen3next-wide-q4_k_m": ("qwen3next-wide", 5, "f32", "Q4_K_M", "int8"),  # the quantizer's mixes
    "qwen3next-wide-iq4_xs": ("qwen3next-wide", 5, "f32", "IQ4_XS", "int8"),
    "qwen35moe-q8_0": ("qwen35moe", 8, "q8_0", None, "float"),           # the split DeltaNet layout, MTP block
    # (a qwen35moe K-quant mix: its tiny model's 64-wide rows would get no K type; tests/test_llamacpp_files.py
    # quantizes qwen35moe and qwen4exp to Q4_K_M where llama-cpp-python is installed)
}
N_IDS = 48


def _hf(arch: str, seed: int, out: Path):
    if arch.startswith("qwen3next"):
        from hf_tiny import make_tiny_hf
        return make_tiny_hf(out, seed=seed, with_mtp=True, sizes=WIDE if arch.endswith("wide") else None)
    from hf_tiny_next import make_tiny_qwen35moe
    return make_tiny_qwen35moe(out, seed=seed, with_mtp=True)  # llama.cpp's converter asserts an MTP block


def _quantize(src: Path, out: Path, ftype: str) -> None:
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed for {out.name}")


def _reference_logits(path: Path, ids: list[int], tmp: Path) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    from strata_py.convert import gguf_to_hf
    hf = gguf_to_hf(path, tmp / f"{path.stem}-hf")
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama", default=str(ROOT / "scratch" / "llama.cpp"), help="llama.cpp tree")
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "llamacpp"))
    a = ap.parse_args(argv)
    import gguf
    llama, out = Path(a.llama), Path(a.out)
    if not (llama / "convert_hf_to_gguf.py").exists():
        raise SystemExit(f"no llama.cpp converter at {llama}")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for name, (arch, seed, outtype, ftype, tol) in FIXTURES.items():
            hf = tmp / f"hf-{arch}-{seed}"
            if not hf.exists():
                _hf(arch, seed, hf)
            converted = tmp / f"{arch}-{seed}-{outtype}.gguf"
            if not converted.exists():
                r = subprocess.run([sys.executable, str(ROOT / "tools" / "llamacpp_convert.py"), str(llama), str(hf),
                                    str(converted), "--outtype", outtype], capture_output=True, text=True)
                if r.returncode != 0:
                    raise SystemExit(f"llama.cpp's converter failed for {name}: {r.stderr[-2000:]}")
            dst = out / f"{name}.gguf"
            if ftype is None:
                dst.write_bytes(converted.read_bytes())
            else:
                _quantize(converted, dst, ftype)
            r = gguf.GGUFReader(str(dst))
            n_vocab = int(next(t for t in r.tensors if t.name == "token_embd.weight").shape[1])
            ids = np.random.default_rng(seed).integers(0, n_vocab, N_IDS).astype(np.int32)
            logits = _reference_logits(dst, ids.tolist(), tmp).astype(np.float32)
            np.savez_compressed(out / f"{name}.npz", ids=ids, logits=logits, tol=np.array(tol))
            types = collections.Counter(t.tensor_type.name for t in r.tensors)
            manifest[name] = {"arch": arch, "hf_seed": seed, "converter_outtype": outtype, "quantizer_ftype": ftype,
                              "tolerance": tol, "tensor_types": dict(sorted(types.items())),
                              "bytes": dst.stat().st_size}
            print(f"{name:22s} {dst.stat().st_size / 1e6:6.2f} MB  {dict(types)}", flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
