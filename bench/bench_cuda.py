"""The CUDA backend's T-row products on the GPU: effective GB/s (weight bytes / time) of every weight type at
T = 1, 2, 4, 8, 16 on real Qwen3-Next-80B-A3B layer shapes, against the card's device-to-device copy bandwidth
measured in the same run, plus the launch overhead of an empty kernel; then the other operations (DeltaNet rows,
attention, MoE routing, sampling) per call at the default model's and the 80B's real dimensions.

    python bench/bench_cuda.py [--types Q4_K,IQ2_XXS] [--reps 10] [--json OUT] [--no-products] [--no-ops]

Each shape is timed over enough distinct matrices (stored back to back, >= 256 MiB in all, 4x the H200's 60 MB L2)
that every product streams its weights from HBM, as decode does; times are CUDA events around back-to-back
launches (median of --reps passes). C(T)/C(1): the cost of a T-row product relative to one row.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cuda_util import CUDA_TYPES, weights  # noqa: E402
from strata_py import _core  # noqa: E402

# (name, rows, cols): the output head, one layer's 512 routed experts' gate rows as one product (a bandwidth probe),
# the DeltaNet qkvz projection, and one routed expert's gate/up and down (the sizes decode really multiplies)
SHAPES = [("lm_head", 151936, 2048), ("exps_gate_all", 512 * 512, 2048), ("dn_qkvz", 12288, 2048),
          ("expert_gate", 512, 2048), ("expert_down", 2048, 512)]
TS = [1, 2, 4, 8, 16]
MIN_BYTES = 256 << 20


def row_bytes(typ: str, cols: int) -> int:
    _, bs, ts, _ = _core.type_info(typ)
    return cols // bs * ts


def weight_set(rng, typ: str, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """nmat matrices back to back (>= MIN_BYTES in all): 32 MiB of random valid blocks, tiled."""
    per = row_bytes(typ, cols) * rows
    nmat = max(1, -(-MIN_BYTES // per))
    chunk_rows = max(1, min(rows * nmat, (32 << 20) // row_bytes(typ, cols)))
    base = weights(rng, typ, chunk_rows, cols)
    return np.resize(base, per * nmat), nmat


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default=",".join(CUDA_TYPES))
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--no-products", action="store_true")
    ap.add_argument("--no-ops", action="store_true")
    a = ap.parse_args(argv)
    if not _core.cuda_available():
        print(f"bench_cuda: no CUDA device ({_core.cuda_info()})", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    copy_bytes = 4 << 30
    cmed, cmin = _core.cuda_bench_copy(copy_bytes, a.reps)
    lmed, lmin = _core.cuda_bench_launch(a.reps)
    res = {"device": _core.cuda_info(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "copy_gbs": 2 * copy_bytes / cmed / 1e9, "launch_us": lmed * 1e6, "products": []}
    print(res["device"])
    print(f"device-to-device copy {res['copy_gbs']:.0f} GB/s (read + write), empty-kernel launch "
          f"{res['launch_us']:.2f} us (back to back)")
    save = (lambda: Path(a.json).write_text(json.dumps(res, indent=1))) if a.json else (lambda: None)
    if not a.no_ops:
        res["ops"] = bench_ops(rng, res["copy_gbs"], a.reps)
        save()
    shapes = [s for s in SHAPES if s[0] in a.shapes.split(",")] if not a.no_products else []
    hdr = f"{'type':8} {'shape':14} {'MB':>7} " + " ".join(f"{'GB/s T=' + str(t):>11}" for t in TS) + \
          "  " + " ".join(f"{'C' + str(t) + '/C1':>6}" for t in TS[1:]) + f" {'us T=1':>8}"
    if shapes:
        print(hdr)
    for typ in a.types.split(",") if shapes else []:
        for name, rows, cols in shapes:
            w, nmat = weight_set(rng, typ, rows, cols)
            x = rng.standard_normal((max(TS), cols)).astype(np.float32)
            tm = _core.cuda_bench_matmul(w, typ, rows, cols, nmat, x, TS, a.reps)
            per = row_bytes(typ, cols) * rows
            row = {"type": typ, "shape": name, "rows": rows, "cols": cols, "bytes": per, "nmat": nmat,
                   "T": TS, "seconds": [m for m, _ in tm], "gbs": [per / m / 1e9 for m, _ in tm]}
            row["c_over_c1"] = [m / tm[0][0] for m, _ in tm]
            row["copy_fraction"] = [g / res["copy_gbs"] for g in row["gbs"]]
            res["products"].append(row)
            save()
            print(f"{typ:8} {name:14} {per / 1e6:7.2f} " + " ".join(f"{g:11.0f}" for g in row["gbs"]) + "  " +
                  " ".join(f"{c:6.2f}" for c in row["c_over_c1"][1:]) + f" {tm[0][0] * 1e6:8.1f}", flush=True)
    save()
    return 0


# (model, DeltaNet dk, dv, value heads x layers; attention q heads per KV head, head dim, KV heads x layers;
#  experts, top-k; vocabulary): tools/default_model.json and Qwen3-Next-80B-A3B's config
MODELS = [("default", 128, 128, 4 * 6, 2, 128, 2 * 2, 32, 4, 8192),
          ("real80b", 128, 128, 32 * 36, 8, 256, 2 * 12, 512, 10, 151936)]
OP_TS = [1, 4, 16]


def bench_ops(rng, copy_gbs: float, reps: int) -> list[dict]:
    """Seconds per call of each non-product operation, the model's real dimensions, T = 1 / 4 / 16 rows; for the
    memory-bound ones (DeltaNet's S read + written, attention's K and V read) the bytes a call must move and their
    fraction of the copy bandwidth. Each op rotates over as many distinct states / caches as the model has (one
    head, or one KV head, per call, as the model calls them), so repeated calls do not live in the L2."""
    rows = []

    def out(op, model, T, sec, nbytes=None, note=""):
        r = {"op": op, "model": model, "T": T, "us": sec * 1e6, "bytes": nbytes, "note": note}
        if nbytes:
            r["gbs"] = nbytes / sec / 1e9
            r["copy_fraction"] = r["gbs"] / copy_gbs
        rows.append(r)
        bw = f"{r['gbs']:8.0f} GB/s ({100 * r['copy_fraction']:4.1f} % of copy)" if nbytes else ""
        print(f"{op:10} {model:8} T={T:<3} {sec * 1e6:9.1f} us  {bw} {note}", flush=True)

    print(f"{'op':10} {'model':8} {'T':5} {'per call':>12}")
    for model, dk, dv, dn_heads, nh, hd, kv_heads, E, k, V in MODELS:
        sbytes = 2 * dk * dv * 4  # S read and written once per call
        for mode, name in ((0, "in place"), (1, "verify")):
            for T, (med, _) in zip(OP_TS, _core.cuda_bench_dn_rows(dk, dv, dn_heads, OP_TS, mode, reps)):
                out("dn_rows", model, T, med, sbytes, f"one head, {name}")
        for n in (512, 4096, 32768):
            kv = 2 * (n + 8) * hd * 4
            for T, (med, _) in zip(OP_TS, _core.cuda_bench_attend(n, nh, hd, kv_heads, OP_TS, reps)):
                out("attend", model, T, med, kv, f"{nh} heads over {n} cells")
        for T in OP_TS:
            med, _ = _core.cuda_bench_route(rng.standard_normal((T, E)).astype(np.float32), k, reps)
            out("moe_route", model, T, med, None, f"{E} experts, top {k}")
        for T in OP_TS:
            logits = (rng.standard_normal((T, V)) * 2.5).astype(np.float32)
            logits[:, rng.integers(0, V, 50)] += 12
            for name, kw in (("greedy", dict()), ("defaults", dict(temperature=0.7, min_p=0.05)),
                             ("top-p 0.95", dict(temperature=1.0, top_p=0.95))):
                med, _ = _core.cuda_bench_sample(logits, _core.SamplingParams(seed=1, **kw), reps)
                out("sample", model, T, med, None, f"{name}, vocab {V}, tokens back on the host")
    return rows


if __name__ == "__main__":
    sys.exit(main())
