"""Prefill of a turn's new tokens after a committed history, the attention kernel's grouped queries against
its one-query path (`_core.attend_one_query`, a bench-only switch: the same bits, slower), alternated in one
process: what issue 16's turn-10 / turn-2 ratio is made of (attention over the history).

    python bench/bench_history.py [MODEL.gguf] [--threads 2] [--new 230] [--history 0,1888] [--reps 5]
                                  [--rounds 3] [--json OUT]

Per (history, path): a fresh session prefills the history in windows of 512 (committed), then the `--new`
tokens are timed (one window, committed): wall time and the process's CPU time (user + system of all its
threads: on a loaded machine the comparable cost, as a descheduled thread does not count), best of each over
reps x rounds, the two paths alternated every rep. The text is this repository's server source, tokenized, so
the tokens are real code.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from strata_py import _core
from strata_py.model import Model

from machine import write_json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="GGUF file (default: the shipped model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=230)
    ap.add_argument("--history", default="0,1888")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    m = Model.load(a.model, threads=a.threads)
    src = (Path(__file__).resolve().parents[1] / "python" / "strata_py" / "server" / "app.py").read_text()
    hist = [int(h) for h in a.history.split(",")]
    ids = m.tokenizer.encode(src)
    while len(ids) < max(hist) + a.new:
        ids = ids + ids
    best, cpu = {}, {}
    load0 = os.getloadavg()
    try:
        for _ in range(a.rounds):
            for h in hist:
                for _ in range(a.reps):
                    for one in (False, True):
                        _core.attend_one_query(one)
                        s = m.session(n_ctx=max(hist) + a.new + 16)
                        for i in range(0, h, 512):
                            part = ids[i:min(h, i + 512)]
                            s.run(part, last_only=True)
                            s.commit(len(part))
                        x = ids[h:h + a.new]
                        t0, c0 = time.perf_counter(), time.process_time()
                        s.run(x, last_only=True)
                        s.commit(len(x))
                        dt, dc = time.perf_counter() - t0, time.process_time() - c0
                        best[(h, one)] = min(best.get((h, one), 1e9), dt)
                        cpu[(h, one)] = min(cpu.get((h, one), 1e9), dc)
    finally:
        _core.attend_one_query(False)
    load1 = os.getloadavg()
    print(f"threads={a.threads} new={a.new} isa={_core.active_isa()} load {load0[0]:.1f} -> {load1[0]:.1f}")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor(),
           "threads": a.threads, "new": a.new, "load_average": [load0[0], load1[0]], "ms": {}}
    for h in hist:
        g, o = best[(h, False)] * 1e3, best[(h, True)] * 1e3
        gc, oc = cpu[(h, False)] * 1e3, cpu[(h, True)] * 1e3
        res["ms"][h] = {"grouped": g, "one_query": o, "grouped_cpu": gc, "one_query_cpu": oc}
        print(f"  after {h:5d}: grouped {g:7.1f} ms (CPU {gc:7.1f})   one-query {o:7.1f} ms (CPU {oc:7.1f})")
    if len(hist) > 1:
        h0, h1 = hist[0], hist[-1]
        for key, name in ((False, "grouped"), (True, "one-query")):
            print(f"  {name}: after {h1} / after {h0} = {best[(h1, key)] / best[(h0, key)]:.2f}x wall, "
                  f"{cpu[(h1, key)] / cpu[(h0, key)]:.2f}x CPU")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
