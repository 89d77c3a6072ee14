"""DeltaNet heads (backend.h dn_heads) of one prompt piece on the card, once on each kernel: for ncu, which times
them (issue 19; docs/BENCHMARKS.md session 31). The 80B's shapes by default (16 key heads, 32 value heads, 128 x 128
state, 512 rows, in place):

    ncu --clock-control none -k regex:k_dn_heads --metrics gpu__time_duration.sum python bench/ncu_dn_heads.py
    python bench/ncu_dn_heads.py --rows 16 --nv 4 --nk 2     # the shipped model's shapes, a 16-row window

The inputs go through _core.backend_layer_op (the tests' path: copies to the card, the op, copies back), so the
wall time this prints is mostly those copies; the kernels' own time is ncu's. Also checks that k_dn_heads_duo and
k_dn_heads_split gave the same bits.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from strata_py import _core  # noqa: E402
from test_cuda_forward import _dn_case  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--nk", type=int, default=16)
    ap.add_argument("--nv", type=int, default=32)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    a = ap.parse_args(argv)
    if not _core.cuda_available():
        ap.error("needs a CUDA build and a GPU (_core.cuda_available() is False)")
    if a.nv % a.nk:
        ap.error(f"bad option --nv {a.nv}: not a multiple of --nk {a.nk}")
    T, nk, nv, dk, dv = a.rows, a.nk, a.nv, a.dk, a.dv
    S, k, v, q, eg, beta = _dn_case(np.random.default_rng(0), T, nk, nv // nk, dk, dv)  # the tests' inputs
    f = [x.ravel() for x in (S, np.full(1, np.nan, np.float32), k, v, q, eg, beta,
                             np.full((T, nv, dv), np.nan, np.float32))]
    n = [nk * dk, nv * dv, nk * dk, nv * dv, nk, nv, dk, dv, T, T, 1, 0]  # in place, o read, no S_work
    out = {}
    try:
        for duo in (True, False):
            _core.cuda_prefer_dn_duo(duo)
            t0 = time.perf_counter()
            fo, _ = _core.backend_layer_op("cuda", "dn_heads", f, [], n, [])
            out[duo] = [np.asarray(x) for x in fo]
            print(f"{'k_dn_heads_duo' if duo else 'k_dn_heads_split'}: {T} rows, {nv} heads, "
                  f"{1e3 * (time.perf_counter() - t0):.2f} ms wall with the copies")
    finally:
        _core.cuda_prefer_dn_duo(True)
    same = all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(out[True], out[False]))
    print("same bits:", same)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
