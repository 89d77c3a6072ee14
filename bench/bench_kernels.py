"""Effective GB/s of each weight type's row-product kernel (weight bytes / time) for T = 1..8 activation
rows, against the machine's memory bandwidth measured in the same run; with --attention, the attention
kernel's GFLOP/s instead (one job, one thread), grouped queries against the one-query path in the same run.

    python bench/bench_kernels.py [--threads 2] [--isa best] [--mib 192] [--json OUT]
    python bench/bench_kernels.py --attention [--isa best] [--json OUT]

Each shape is timed over enough distinct matrices (stored back to back, --mib in all) that every product
streams its weights from DRAM, as decode does. Bandwidth: numpy sum (read) and copy over a 1 GiB array,
1 thread and `threads` threads (numpy releases the GIL, so two sums run on two cores).
"""
from __future__ import annotations

import argparse
import platform
import sys
import threading
import time

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from strata_py import _core, synth

from machine import write_json

TYPES = ["Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ3_XXS", "Q8_0", "BF16", "F16"]
SHAPES = [(2048, 2048), (512, 2048), (2048, 512)]


def bandwidth(threads: int, gib: float = 1.0) -> dict:
    a = np.ones(int(gib * 2**30) // 8, dtype=np.float64)
    b = np.empty_like(a)
    a.sum(); np.copyto(b, a)  # page in

    def timed(fn, parts):
        chunks = np.array_split(np.arange(a.size), parts)
        bounds = [(c[0], c[-1] + 1) for c in chunks]
        best = 1e9
        for _ in range(3):
            ts = [threading.Thread(target=fn, args=bd) for bd in bounds]
            t0 = time.perf_counter()
            for t in ts: t.start()
            for t in ts: t.join()
            best = min(best, time.perf_counter() - t0)
        return best

    res = {}
    for n in sorted({1, threads}):
        res[f"read_gbs_{n}t"] = a.nbytes / timed(lambda i, j: a[i:j].sum(), n) / 1e9
        res[f"copy_gbs_{n}t"] = 2 * a.nbytes / timed(lambda i, j: np.copyto(b[i:j], a[i:j]), n) / 1e9
    return res


def weights(rng, typ: str, rows: int, cols: int, nmat: int) -> np.ndarray:
    qt = QT[typ]
    if typ in ("Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ3_XXS"):
        return synth.random_blocks(rng, qt, nmat * rows * cols // 256, 1 / np.sqrt(cols)).ravel()
    if typ == "Q8_0":
        return synth._weight(rng, (nmat * rows, cols), qt).ravel()
    x = (rng.standard_normal(nmat * rows * cols, dtype=np.float32) / np.sqrt(cols))
    return (x.astype(np.float16) if typ == "F16" else gguf.quants.quantize(x, qt)).view(np.uint8).ravel()


# attention jobs as the model runs them: (T rows, nh query heads per KV head, n0 cells seen by row 0, hd, ldkv)
ATTN_SHAPES = [(58, 2, 1888, 128, 256),   # default model: a 230-token turn after 1888 tokens, one of 4 row runs
               (1, 2, 1888, 128, 256),    # default model: decode
               (64, 4, 4096, 128, 256),   # bench model: a 4k prompt's last rows
               (64, 8, 4096, 256, 512),   # Qwen3-Next-80B shapes
               (64, 2, 512, 64, 128)]     # tiny model


def attention(isa: str, reps: int, rounds: int = 3) -> dict:
    """Seconds per job (best over rounds, the two paths alternated) and GFLOP/s (4 T nh n hd flops)."""
    best = {}
    for _ in range(rounds):
        for shape in ATTN_SHAPES:
            for one in (False, True):
                t = _core.bench_attend(*shape, isa=isa, one_query=one, reps=reps)
                best[(shape, one)] = min(best.get((shape, one), 1e9), t)
    out = {}
    print(f"attention, isa={isa}, 1 thread: us per job (GFLOP/s); grouped queries vs the one-query path")
    for shape in ATTN_SHAPES:
        T, nh, n0, hd, _ = shape
        flop = 4.0 * T * nh * (n0 + (T - 1) / 2) * hd
        g, o = best[(shape, False)], best[(shape, True)]
        out[f"T={T} nh={nh} n0={n0} hd={hd}"] = {"us": g * 1e6, "us_one_query": o * 1e6, "gflops": flop / g / 1e9,
                                                  "gflops_one_query": flop / o / 1e9}
        print(f"  T={T:<3} nh={nh} n0={n0:<5} hd={hd:<4} {g * 1e6:9.1f} ({flop / g / 1e9:5.1f})   "
              f"one query {o * 1e6:9.1f} ({flop / o / 1e9:5.1f})   x{o / g:.2f}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=None, help="scalar|avx2|avx512 (default: best)")
    ap.add_argument("--mib", type=float, default=192, help="weight bytes per shape, rotated over")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--attention", action="store_true", help="the attention kernel instead of the row products")
    a = ap.parse_args(argv)
    isa = a.isa or _core.best_isa()
    if a.attention:
        res = {"machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
               "isa": isa, "attention": attention(isa, max(a.reps, 5))}
        write_json(a.json, res)
        return 0
    rng = np.random.default_rng(0)
    res = {"machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "threads": a.threads, "isa": isa, "bandwidth": bandwidth(a.threads), "kernels": {}}
    bw = res["bandwidth"][f"read_gbs_{a.threads}t"]
    print(f"isa={isa} threads={a.threads}  memory read {bw:.1f} GB/s ({a.threads} threads), "
          f"{res['bandwidth']['read_gbs_1t']:.1f} GB/s (1 thread)")
    print(f"{'type':<8} {'shape':<10} " + " ".join(f"{'T=' + str(t):>7}" for t in range(1, 9)) + "   GB/s; C(4)/C(1)")
    for typ in a.types.split(","):
        tsize, bsize = gguf.GGML_QUANT_SIZES[QT[typ]][1], gguf.GGML_QUANT_SIZES[QT[typ]][0]
        for rows, cols in SHAPES:
            mbytes = rows * cols // bsize * tsize
            nmat = max(2, int(a.mib * 2**20 // mbytes))
            w = weights(rng, typ, rows, cols, nmat)
            row = {}
            for T in range(1, 9):
                x = rng.standard_normal((T, cols)).astype(np.float32)
                sec = _core.bench_matmul(w, typ, rows, cols, nmat, x, isa=isa, threads=a.threads, reps=a.reps)
                row[T] = {"us": sec * 1e6, "gbs": mbytes / sec / 1e9}
            res["kernels"][f"{typ} {rows}x{cols}"] = row
            print(f"{typ:<8} {rows}x{cols:<5} " + " ".join(f"{row[t]['gbs']:7.1f}" for t in range(1, 9))
                  + f"   {row[4]['us'] / row[1]['us']:.2f}")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
