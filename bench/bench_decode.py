"""Prefill and decode speed, window latency C(T) for T = 1..8, and the DeltaNet fold cost per mode.

    python bench/bench_decode.py MODEL.gguf [--threads N] [--prompt 256] [--decode 64] [--reps 30] [--json OUT]
    python bench/bench_decode.py MODEL.gguf --prefill-lengths 512,4096,16384 [--prefill serial] --only-prefill

Decode tok/s is the median over single-token windows; C(T) is the median latency of a T-row verify window
followed by commit(1) (the most expensive rollback: T-1 rows rejected), from the same position each time.
The fold cost is measured inside the engine (Session.last_fold_seconds) for keep = T-1 after T-row windows.
--prefill-lengths: prefill tok/s of prompts of those lengths the way generation prefills (prompt windows of
512 rows, speculative.prefill), once each after a warm-up (--prefill chooses the DeltaNet form of prompt
windows: chunked or serial). Prints a short table and writes JSON; every result records the machine
(CPU flags, load average, date: bench/machine.py).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

from strata_py import _core
from strata_py.config import GenerationConfig
from strata_py.model import Model
from strata_py.speculative import prefill

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe, machine_info, write_json  # noqa: E402


def median_ms(xs):
    return statistics.median(xs) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=64, help="decode steps timed")
    ap.add_argument("--reps", type=int, default=30, help="repetitions per window size")
    ap.add_argument("--max-t", type=int, default=8)
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--prefill-lengths", default="", help="comma-separated prompt lengths for prefill tok/s")
    ap.add_argument("--prefill", default="serial", choices=("chunked", "serial"))
    ap.add_argument("--only-prefill", action="store_true", help="only the --prefill-lengths measurements")
    a = ap.parse_args(argv)

    model = Model.load(a.model, threads=a.threads)
    rng = np.random.default_rng(0)
    V = model.n_vocab
    prompt = rng.integers(0, V, a.prompt).tolist()
    res = {"model": os.path.basename(a.model), "threads": model.threads, "isa": _core.active_isa(),
           "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
           "config": {k: v for k, v in model.config.items() if k != "recurrent"}, "host": machine_info(_core.active_isa())}

    if a.prefill_lengths:
        lengths = [int(x) for x in a.prefill_lengths.split(",")]
        s = model.session(n_ctx=64 + 8, prefill=a.prefill)
        prefill(s, prompt[:64] if len(prompt) >= 64 else rng.integers(0, V, 64).tolist())  # warm-up: page-in
        res["prefill_by_length"] = {}
        for n in lengths:
            ids = np.random.default_rng(n).integers(0, V, n).tolist()
            s = model.session(n_ctx=n + 8, prefill=a.prefill)
            t, c = time.perf_counter(), time.process_time()
            prefill(s, ids)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            res["prefill_by_length"][n] = {"tok_s": n / wall, "seconds": wall, "cpu_seconds": cpu,
                                           "load_avg_1m": os.getloadavg()[0], "mode": a.prefill}
            print(f"prefill {n:6d} tokens ({a.prefill}): {n / wall:8.1f} tok/s ({wall:.1f} s, {cpu:.1f} CPU s, "
                  f"load avg {os.getloadavg()[0]:.1f})", flush=True)
        if a.only_prefill:
            print(describe(res["host"]))
            write_json(a.json, res)
            return 0

    # prefill: best of 3 whole-prompt runs (the first warms caches and page-ins)
    times = []
    for _ in range(3):
        s = model.session(n_ctx=a.prompt + a.decode + 2 * a.max_t + 8)
        t = time.perf_counter()
        s.run(prompt, last_only=True)
        s.commit(len(prompt))
        times.append(time.perf_counter() - t)
    res["prefill_tok_s"] = a.prompt / min(times)

    # decode: T = 1 windows
    dec = []
    tok = prompt[-1]
    for _ in range(a.decode):
        t = time.perf_counter()
        s.run([tok])
        out = s.sample(GenerationConfig(temperature=0.0))
        s.commit(1)
        dec.append(time.perf_counter() - t)
        tok = int(out[0])
    res["decode_ms_median"] = median_ms(dec)
    res["decode_tok_s"] = 1e3 / res["decode_ms_median"]

    # window latency C(T) and fold cost per mode, from one checkpoint
    base = s.checkpoint()
    res["window_ms"] = {}
    res["fold_ms"] = {}
    for fold in ("lazy", "eager", "partial"):
        w = model.session(n_ctx=s.n_ctx, fold=fold)
        w.restore(base)
        cost, fcost = {}, {}
        for T in range(1, a.max_t + 1):
            lat, fl = [], []
            drafts = rng.integers(0, V, T).tolist()
            for _ in range(a.reps):
                w.restore(base)
                t = time.perf_counter()
                w.run(drafts)
                w.sample(GenerationConfig(temperature=0.0))
                w.commit(1)
                lat.append(time.perf_counter() - t)
                if T > 1:  # fold cost of keep = T-1 after a T-row window (eager: in commit; lazy: next run)
                    w.restore(base)
                    w.run(drafts)
                    w.commit(T - 1)
                    f0 = w._core.last_fold_seconds
                    w.run([drafts[0]])
                    fl.append(f0 + w._core.last_fold_seconds)
                    w.commit(1)
            cost[T] = median_ms(lat)
            if fl:
                fcost[T] = median_ms(fl)
        res["window_ms"][fold] = cost
        res["fold_ms"][fold] = fcost
    c = res["window_ms"]["lazy"]
    res["c4_over_c1"] = c[4] / c[1] if 4 in c else None

    print(f"{res['model']}  threads={res['threads']}  isa={res['isa']}")
    print(f"prefill {res['prefill_tok_s']:.1f} tok/s   decode {res['decode_tok_s']:.1f} tok/s "
          f"({res['decode_ms_median']:.2f} ms median)")
    print("T    " + "  ".join(f"{f:>16}" for f in ("lazy C(T) ms", "eager C(T) ms", "partial C(T) ms",
                                                     "fold lazy ms", "fold eager ms", "fold partial ms")))
    for T in range(1, a.max_t + 1):
        row = [res["window_ms"][f][T] for f in ("lazy", "eager", "partial")]
        row += [res["fold_ms"][f].get(T, 0.0) for f in ("lazy", "eager", "partial")]
        print(f"{T:<4} " + "  ".join(f"{v:>16.3f}" for v in row))
    if res["c4_over_c1"]:
        print(f"C(4)/C(1) = {res['c4_over_c1']:.2f}")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
