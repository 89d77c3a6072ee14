"""The 80B file's prompt-piece products on the card, once each: for ncu, which times them (issue 19; the prefill's two
largest parts, docs/BENCHMARKS.md sessions 31-32): the dense IQ2_XXS products of a 512-row piece (k_iq2xxs_panel) at
the real shapes, and one MoE layer's routed experts (gate / up / SwiGLU, then down: k_sel_tiles and the tensor-core
tiles) for 512 rows of top-10 routing over 512 experts.

    ncu --clock-control none -k regex:'k_iq2xxs|k_sel' --metrics gpu__time_duration.sum \\
        python bench/ncu_prefill_products.py
    python bench/ncu_prefill_products.py --check     # and compare every output with the CPU backend, bit for bit

The inputs go through _core.backend_matmul / backend_layer_op (the tests' paths: copies to the card, the product,
copies back), so the wall time this prints is mostly the copies; the kernels' own time is ncu's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cuda_util import bits, weights  # noqa: E402
from strata_py import _core  # noqa: E402

# (name, rows, cols): the 80B file's dense IQ2_XXS products of a layer (DeltaNet qkvz and out, attention q + gate and
# out, the shared expert's gate)
DENSE = [("dn_qkvz", 12288, 2048), ("dn_out", 2048, 4096), ("attn_q", 8192, 2048), ("shexp_gate", 512, 2048)]


def tiled(rng, typ: str, rows: int, cols: int, n: int = 1) -> np.ndarray:
    """n matrices of rows x cols: 16 MiB of random valid blocks, repeated (the kernels' time does not depend on the
    values; every block stays valid)."""
    one = weights(rng, typ, 1, cols)
    per = one.size * rows * n
    base = weights(rng, typ, max(1, min(rows * n, (16 << 20) // one.size)), cols)
    return np.resize(base, per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=512, help="activation rows (the prompt piece)")
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--only", default="dense,experts")
    ap.add_argument("--check", action="store_true", help="compare with the CPU backend, bit for bit")
    ap.add_argument("--tile-stage", choices=["on", "off"], default="on",
                    help="the expert tiles' activation rows staged in shared memory (cuda_prefer_tile_stage)")
    ap.add_argument("--panel-staged", choices=["on", "off"], default="on",
                    help="the dense panel's activation rows staged in shared memory (cuda_prefer_iq2_panel_staged)")
    a = ap.parse_args(argv)
    if not _core.cuda_available():
        ap.error("needs a CUDA build and a GPU (_core.cuda_available() is False)")
    _core.cuda_prefer_tile_stage(a.tile_stage == "on")
    _core.cuda_prefer_iq2_panel_staged(a.panel_staged == "on")
    rng = np.random.default_rng(0)
    T, ok = a.rows, True
    if "dense" in a.only:
        for name, rows, cols in DENSE:
            w = tiled(rng, "IQ2_XXS", rows, cols)
            x = rng.standard_normal((T, cols)).astype(np.float32)
            t0 = time.perf_counter()
            got = _core.backend_matmul("cuda", w, "IQ2_XXS", rows, cols, x)
            line = f"dense {name} {rows} x {cols}, {T} rows: {1e3 * (time.perf_counter() - t0):.1f} ms wall"
            if a.check:
                same = np.array_equal(bits(got), bits(_core.backend_matmul("cpu", w, "IQ2_XXS", rows, cols, x)))
                ok &= same
                line += f", CPU == GPU: {same}"
            print(line)
    if "experts" in a.only:
        E, k, F, H = a.experts, a.top, 512, 2048
        mats = [tiled(rng, "IQ2_XXS", r, c, E) for r, c in ((F, H), (F, H), (H, F))]
        words = [np.concatenate([w, np.zeros((-w.size) % 4, np.uint8)]).view(np.int32) for w in mats]
        sel = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32).ravel()
        x = rng.standard_normal((T, H)).astype(np.float32)
        S = T * k
        n = [int(QT.IQ2_XXS), F, H, S, k, mats[0].size // E, mats[2].size // E]
        f = [x.ravel(), *(np.full(S * c, np.nan, np.float32) for c in (F, F, H))]
        outs = {}
        for be in ("cuda", "cpu") if a.check else ("cuda",):
            t0 = time.perf_counter()
            fo, _ = _core.backend_layer_op(be, "moe_experts", f, [sel, *words], n, [])
            outs[be] = [np.asarray(v) for v in fo]
            print(f"experts on {be}: {E} experts, top {k}, {T} rows: {1e3 * (time.perf_counter() - t0):.1f} ms wall")
        if a.check:
            same = all(np.array_equal(bits(u), bits(v)) for u, v in zip(outs["cuda"], outs["cpu"]))
            ok &= same
            print("experts CPU == GPU:", same)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
