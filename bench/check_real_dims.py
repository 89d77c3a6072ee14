"""Correctness at Qwen3-Next-80B-A3B's real dimensions (issue 17 item 4), a bench-time check (the files are
1-4 GB and transformers needs ~8 GB for them: too big for CI; tests/test_real_dims.py runs the same shapes
with a small vocabulary and few experts on every run).

    python bench/check_real_dims.py OUT_DIR [--experts 16] [--file512 80B-4L.gguf] [--json OUT]

1. `synth 80b --layers 4 --experts E` (every layer dimension real, vocabulary 151 936) as Q8_0: strata against
   transformers float32 on the same (dequantized) weights: max relative L2 error per position <= 1e-4.
2. The same model as Q4_K_M: strata and llama.cpp each against transformers on its dequantized weights (both
   quantize activations to 8 bits: this is their quantized-activation noise), and strata against llama.cpp.
3. --file512: a 4-layer real-dimension file with all 512 experts (synth 80b --layers 4 --type q4_k_m): strata
   against llama.cpp, to be read against step 2's noise (no float reference fits in memory for it).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe, machine_info, write_json  # noqa: E402

from strata_py import synth  # noqa: E402
from strata_py.model import Model  # noqa: E402


def rel_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def summary(r: np.ndarray) -> dict:
    return {"median": float(np.median(r)), "max": float(r.max())}


def transformers_logits(path: Path, hf_dir: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import Qwen3NextForCausalLM

    from strata_py.convert import gguf_to_hf
    model = Qwen3NextForCausalLM.from_pretrained(gguf_to_hf(path, hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids])).logits[0].float().numpy()
    del model
    gc.collect()
    return out


def strata_logits(path: Path, ids: list[int], threads: int) -> np.ndarray:
    return Model.load(path, threads=threads).session(n_ctx=len(ids) + 8).run(ids).copy()


def llama_logits(path: Path, ids: list[int], threads: int) -> np.ndarray:
    from llama_cpp import Llama
    llm = Llama(str(path), n_threads=threads, n_ctx=len(ids) + 8, logits_all=True, verbose=False)
    llm.eval(ids)
    out = np.array(llm.scores[:len(ids)], dtype=np.float32)
    del llm
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--file512", default=None)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(3).integers(0, 4096, a.tokens).tolist()
    res = {"machine": machine_info(), "experts": a.experts, "tokens": a.tokens}
    t0 = time.time()

    q8 = synth.write("80b", out / f"80b-4l-e{a.experts}-q8_0.gguf", "q8_0", seed=11, n_layer=4, n_expert=a.experts)
    ref = transformers_logits(q8, out / "hf-q8", ids)
    r = rel_rows(strata_logits(q8, ids, a.threads), ref)
    res["q8_0_strata_vs_transformers"] = summary(r)
    print(f"Q8_0, 4 layers, {a.experts} experts: strata vs transformers float32 max {r.max():.2e} (target <= 1e-4)",
          flush=True)
    q8.unlink()

    qk = synth.write("80b", out / f"80b-4l-e{a.experts}-q4_k_m.gguf", "q4_k_m", seed=11, n_layer=4, n_expert=a.experts)
    ref = transformers_logits(qk, out / "hf-q4km", ids)
    ours = strata_logits(qk, ids, a.threads)
    res["q4_k_m_strata_vs_transformers"] = summary(rel_rows(ours, ref))
    if not a.skip_llama:
        theirs = llama_logits(qk, ids, a.threads)
        res["q4_k_m_llama_vs_transformers"] = summary(rel_rows(theirs, ref))
        res["q4_k_m_strata_vs_llama"] = summary(rel_rows(ours, theirs))
        res["q4_k_m_argmax_agree"] = float(np.mean(ours.argmax(1) == theirs.argmax(1)))
    for k, v in res.items():
        if k.startswith("q4_k_m") and isinstance(v, dict):
            print(f"Q4_K_M, 4 layers, {a.experts} experts: {k[7:]} median {v['median']:.4f} max {v['max']:.4f}", flush=True)
    qk.unlink()

    if a.file512 and not a.skip_llama:
        ours = strata_logits(Path(a.file512), ids, a.threads)
        theirs = llama_logits(Path(a.file512), ids, a.threads)
        res["file512"] = os.path.basename(a.file512)
        res["file512_strata_vs_llama"] = summary(rel_rows(ours, theirs))
        res["file512_argmax_agree"] = float(np.mean(ours.argmax(1) == theirs.argmax(1)))
        v = res["file512_strata_vs_llama"]
        print(f"{res['file512']} (512 experts): strata vs llama.cpp median {v['median']:.4f} max {v['max']:.4f}, "
              f"argmax agree {res['file512_argmax_agree']:.2f}", flush=True)
    res["seconds"] = time.time() - t0
    print(describe(res["machine"]))
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
