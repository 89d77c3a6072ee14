"""Decode time against context length: T = 1 decode ms/token at contexts of 1k, 4k, 16k and 32k tokens (and
prefill tok/s on the way there), for a qwen4exp model with QSA and the same model forced dense (a bench-only
load option: it changes the model), and llama.cpp on the same file (--peer).

    python bench/bench_context.py MODEL.gguf [--contexts 1024,4096,16384,32768] [--decode 16] [--threads 2]
                                  [--modes qsa,dense] [--peer] [--json OUT]

The contexts are reached by prefilling random tokens in prompt windows of 512 (timed: prefill tok/s per
segment); at each context the decode steps run from a checkpoint of that context (restored after), so every
mode decodes at exactly the same positions. QSA is sparse past its budget: its decode time should stay flat,
dense attention's grows with the context. llama.cpp's QSA over-selects (qwen4exp.md 6), so its timings are
of a slightly different computation; --peer runs it alternated with strata on the same tokens.
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
from strata_py.model import Model

from machine import write_json

CHUNK = 512


def strata_sweep(model, tokens, contexts, n_dec, label=""):
    s = model.session(n_ctx=max(contexts) + n_dec + 8)
    out, pos, pre_t = {}, 0, 0.0
    for c in contexts:
        t0 = time.perf_counter()
        while pos < c:
            n = min(CHUNK, c - pos)
            s.run(tokens[pos:pos + n], last_only=True)
            s.commit(n)
            pos += n
        pre_t += time.perf_counter() - t0
        base = s.checkpoint()
        dec = []
        for i in range(n_dec):
            t0 = time.perf_counter()
            s.run([tokens[c + i]])
            s.commit(1)
            dec.append(time.perf_counter() - t0)
        s.restore(base)
        out[c] = {"decode_ms": statistics.median(dec) * 1e3, "decode_ms_min": min(dec) * 1e3,
                  "prefill_tok_s": c / pre_t}
        print(f"  {label} {c}: {out[c]['decode_ms']:.2f} ms/token, prefill {out[c]['prefill_tok_s']:.1f} tok/s", flush=True)
    return out


def llama_sweep(llm, tokens, contexts, n_dec, label="llama.cpp"):
    # a hybrid model's recurrent state cannot be cut back in llama.cpp: the decoded tokens stay in its context,
    # so its later segments start n_dec tokens past strata's (a few tokens in thousands)
    llm.reset()
    out, pos, pre_t = {}, 0, 0.0
    for c in contexts:
        t0 = time.perf_counter()
        llm.eval(tokens[pos:c])
        pre_t += time.perf_counter() - t0
        dec = []
        for i in range(n_dec):
            t0 = time.perf_counter()
            llm.eval([tokens[c + i]])
            dec.append(time.perf_counter() - t0)
        pos = c + n_dec
        out[c] = {"decode_ms": statistics.median(dec) * 1e3, "decode_ms_min": min(dec) * 1e3,
                  "prefill_tok_s": c / pre_t}
        print(f"  {label} {c}: {out[c]['decode_ms']:.2f} ms/token, prefill {out[c]['prefill_tok_s']:.1f} tok/s", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--contexts", default="1024,4096,16384,32768")
    ap.add_argument("--decode", type=int, default=16, help="decode steps timed per context")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="qsa,dense", help="qsa, dense (strata) in this order, alternated")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--peer", action="store_true", help="llama.cpp (llama-cpp-python) on the same file")
    ap.add_argument("--limit", default="", help="largest context per contender, e.g. dense=16384,llama.cpp=16384 "
                                                "(dense prefill grows with the square of the context)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    contexts = [int(c) for c in a.contexts.split(",")]
    modes = a.modes.split(",")
    models = {m: Model.load(a.model, threads=a.threads, _dense_attention=(m == "dense")) for m in modes}
    V = next(iter(models.values())).n_vocab
    tokens = np.random.default_rng(0).integers(1, V, max(contexts) + len(contexts) * a.decode + 8).tolist()
    llm = None
    if a.peer:
        from llama_cpp import Llama
        llm = Llama(a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=max(contexts) + len(contexts) * a.decode + 8,
                    n_batch=CHUNK, verbose=False)
    limit = {k: int(v) for k, v in (x.split("=") for x in a.limit.split(",") if x)}
    upto = lambda name: [c for c in contexts if c <= limit.get(name, contexts[-1])]
    runs = {m: [] for m in modes}
    if llm is not None:
        runs["llama.cpp"] = []
    for _ in range(a.rounds):  # alternate the contenders so background load hits all alike
        for m in modes:
            runs[m].append(strata_sweep(models[m], tokens, upto(m), a.decode, m))
        if llm is not None:
            runs["llama.cpp"].append(llama_sweep(llm, tokens, upto("llama.cpp"), a.decode))
    res = {"model": os.path.basename(a.model), "threads": a.threads, "isa": _core.active_isa(),
           "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_avg_1m": os.getloadavg()[0], "summary": next(iter(models.values()))._core.summary(),
           "contexts": contexts, "results": {}}
    for name, rs in runs.items():
        res["results"][name] = {c: {k: statistics.median(r[c][k] for r in rs) for k in rs[0][c]} for c in upto(name)}
    print(f"{res['model']}  threads={a.threads}  isa={res['isa']}  load avg {res['load_avg_1m']:.1f}")
    print(f"{'context':>8} " + " ".join(f"{n + ' ms/tok':>18} {n + ' prefill':>18}" for n in runs))
    for c in contexts:
        row = []
        for n in runs:
            r = res["results"][n].get(c)
            row += [f"{r['decode_ms']:18.2f}", f"{r['prefill_tok_s']:18.1f}"] if r else [f"{'-':>18}", f"{'-':>18}"]
        print(f"{c:>8} " + " ".join(row))
    for n in runs:
        r = res["results"][n]
        lo, hi = min(r), max(r)
        print(f"{n}: decode at {hi} / at {lo} = {r[hi]['decode_ms'] / r[lo]['decode_ms']:.2f}")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
