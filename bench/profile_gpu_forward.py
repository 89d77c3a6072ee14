"""Where a GPU decode step's time goes (issue 19): the device time of every kernel and copy of a few T-row steps of
backend="cuda", read through PyTorch's profiler (CUPTI: it sees the kernels of any library in the process), beside
the wall time per step. Sum of device time per step close to the wall time: the card is busy and kernels are the
cost; far below: the host (launches, Python, copies) is. With programmatic dependent launch (--launches on) the
kernels overlap and their sum overstates the card's work: "busy" is the union of the kernel and copy intervals (the
time the card is doing something) and "idle" the rest of the wall time; "host" lists the CUDA runtime calls the
host made per step (a synchronizing copy's time is mostly waiting for the card). Then, without the profiler, the
wall time of run() and of commit() per step (medians) and the steps that ran cold (unrecorded or being recorded).

    python bench/profile_gpu_forward.py MODEL.gguf [--T 1,4] [--steps 10] [--top 25]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from launch_modes import LAUNCH_MODES, set_launches
from strata_py.model import Model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--T", default="1,4")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--dp4a", action="store_true", help="IQ2_XXS products on the dp4a kernels, not the tensor cores")
    ap.add_argument("--mma-min-rows", type=int, default=5, help="dense IQ2_XXS rows from which the tensor cores run")
    ap.add_argument("--launches", default="on", choices=LAUNCH_MODES,
                    help="programmatic dependent launch + the dense weight prefetch (on), without the prefetch, or off")
    a = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile
    from strata_py import _core
    _core.cuda_prefer_mma(not a.dp4a, a.mma_min_rows)
    set_launches(a.launches)
    m = Model.load(a.model, backend="cuda")
    V = m.n_vocab
    rng = np.random.default_rng(0)
    for T in (int(t) for t in a.T.split(",")):
        s = m.session(n_ctx=4096, max_window=16)
        s.run(rng.integers(0, V, 64).tolist())
        s.commit(64)
        for _ in range(3):
            s.run(rng.integers(0, V, T).tolist())
            s.commit(T)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(a.steps):  # past max_window a prompt: its last row's logits only, as generate's prefill
                s.run(rng.integers(0, V, T).tolist(), last_only=T > 16)
                s.commit(T)
            wall = (time.perf_counter() - t0) / a.steps
        rows = []
        for e in prof.key_averages():
            dev = getattr(e, "self_device_time_total", None)
            if dev is None:
                dev = getattr(e, "self_cuda_time_total", 0)
            if dev > 0:
                rows.append((dev, e.count, e.key[:90]))
        busy = sum(r[0] for r in rows) / a.steps
        launches = sum(r[1] for r in rows) / a.steps
        print(f"\n{m.path.name} T = {T}: wall {wall * 1e3:.2f} ms/step, device time {busy / 1e3:.2f} ms/step "
              f"({len(rows)} kernel kinds, {launches:.0f} kernels and copies per step)")
        for dev, n, k in sorted(rows, reverse=True)[:a.top]:
            print(f"  {dev / a.steps / 1e3:8.3f} ms/step {n / a.steps:6.0f}x {dev / n:8.1f} us  {k}")
        if not rows:  # this torch names the fields otherwise: its own table
            print(prof.key_averages().table(row_limit=a.top))
        print_busy(prof, a.steps, wall)
        print_split(s, V, T, a.steps, rng)
    del torch
    return 0


def print_busy(prof, steps: int, wall: float) -> None:
    """The card's busy time per step (the union of its kernel and copy intervals) and the host's CUDA calls."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            ev = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    dev = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in ev
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, end = 0.0, -1.0
    for t0, t1 in dev:  # the union of the intervals
        if t1 > end:
            busy += t1 - max(t0, end)
            end = t1
    host = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            n, d = host.get(e["name"], (0, 0.0))
            host[e["name"]] = (n + 1, d + e.get("dur", 0))
    print(f"  busy {busy / steps / 1e3:.3f} ms/step of the wall {wall * 1e3:.3f} (idle "
          f"{max(0.0, wall * 1e3 - busy / steps / 1e3):.3f})")
    top = sorted(host.items(), key=lambda kv: -kv[1][1])[:6]
    print("  host: " + ", ".join(f"{k} {d / steps / 1e3:.3f} ms ({n / steps:.0f}x)" for k, (n, d) in top))


def print_split(s, V: int, T: int, steps: int, rng) -> None:
    """run() and commit() wall times per step without the profiler (medians), and the cold steps among them."""
    run_t, commit_t = [], []
    cold = s._core.cold_steps
    for _ in range(steps):
        toks = rng.integers(0, V, T).tolist()
        t0 = time.perf_counter()
        s.run(toks, last_only=T > 16)
        t1 = time.perf_counter()
        s.commit(T)
        t2 = time.perf_counter()
        run_t.append(t1 - t0)
        commit_t.append(t2 - t1)
    print(f"  unprofiled: run {np.median(run_t) * 1e3:.3f} ms, commit {np.median(commit_t) * 1e3:.3f} ms (medians "
          f"of {steps}; max {max(run_t) * 1e3:.3f} / {max(commit_t) * 1e3:.3f}), {s._core.cold_steps - cold} cold")


if __name__ == "__main__":
    sys.exit(main())
