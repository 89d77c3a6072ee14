"""strata vs llama.cpp (llama-cpp-python) on the same GGUF, same threads, same prompt: decode tok/s (T = 1),
prefill tok/s, as ratios from one run; strata's window cost C(4)/C(1); T = 1 decode time against the
memory-bandwidth floor (weight bytes read per token / measured read bandwidth).

    python bench/bench_peers.py MODEL.gguf [--threads 2] [--prompt 128] [--decode 32] [--rounds 3] [--json OUT]
        [--isa avx2] [--llama-path DIR]

Measurements alternate between the engines (`--rounds` rounds), so background load hits both alike; the
table gives medians and, for a busy machine, the best (minimum) times too.
llama-cpp-python is an optional bench dependency (it builds llama.cpp from source): pip install llama-cpp-python.
--isa runs strata's kernels as on a CPU whose best path is that one (an AVX2-only machine: --isa avx2), and
--llama-path DIR imports a llama-cpp-python built into DIR (pip install --target DIR ...), e.g. one built with
-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF for the same comparison; its system info goes in the JSON.
Prompts are prefilled the way generation does it (prompt windows of at most 512 rows; llama.cpp n_batch 512).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import bandwidth  # noqa: E402

from machine import describe, machine_info, write_json  # noqa: E402
from strata_py import _core  # noqa: E402
from strata_py.model import Model  # noqa: E402
from strata_py.speculative import prefill  # noqa: E402


def bytes_per_token(path: str) -> int:
    """Weight bytes one T = 1 decode step reads: every matrix once, k of E experts, one embedding row."""
    r = gguf.GGUFReader(path)
    kv = {f.name: f for f in r.fields.values()}
    arch = bytes(kv["general.architecture"].parts[-1]).decode()
    E = int(kv[f"{arch}.expert_count"].parts[-1][0])
    k = int(kv[f"{arch}.expert_used_count"].parts[-1][0])
    total = 0
    for t in r.tensors:
        n = int(t.n_bytes)
        if "_exps" in t.name:
            total += n * k // E
        elif t.name == "token_embd.weight":
            total += n // int(t.shape[-1])
        else:
            total += n
    return total


def strata_round(model, prompt, n_dec, reps):
    s = model.session(n_ctx=len(prompt) + n_dec + 16)
    t = time.perf_counter()
    prefill(s, prompt)
    prefill_s = time.perf_counter() - t
    base = s.checkpoint()
    dec = []
    tok = prompt[-1]
    for i in range(n_dec):
        t = time.perf_counter()
        s.run([tok])
        s.commit(1)
        dec.append(time.perf_counter() - t)
        tok = prompt[i % len(prompt)]
    win = {}
    for T in (1, 4):
        lat = []
        for _ in range(reps):
            s.restore(base)
            t = time.perf_counter()
            s.run(prompt[:T])
            s.commit(1)
            lat.append(time.perf_counter() - t)
        win[T] = statistics.median(lat)
    return prefill_s, statistics.median(dec), win


def llama_round(llm, prompt, n_dec):
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t
    dec = []
    for i in range(n_dec):
        t = time.perf_counter()
        llm.eval([prompt[i % len(prompt)]])
        dec.append(time.perf_counter() - t)
    return prefill, statistics.median(dec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=9, help="window repetitions per round")
    ap.add_argument("--json")
    ap.add_argument("--isa", default=None, help="strata kernel path (default: the best this CPU has)")
    ap.add_argument("--llama-path", default=None, help="import llama_cpp from this directory first")
    a = ap.parse_args(argv)
    if a.llama_path:
        sys.path.insert(0, a.llama_path)
    from llama_cpp import Llama, llama_print_system_info
    if a.isa:
        _core.force_isa(a.isa)

    bw = bandwidth(a.threads)
    model = Model.load(a.model, threads=a.threads)
    llm = Llama(a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.prompt + a.decode + 16,
                n_batch=512, verbose=False)
    V = min(model.n_vocab, llm.n_vocab())
    prompt = np.random.default_rng(0).integers(1, V, a.prompt).tolist()
    S_pre, S_dec, S_c1, S_c4, L_pre, L_dec = [], [], [], [], [], []
    strata_round(model, prompt[:16], 4, 2)  # warm both (page-in)
    llama_round(llm, prompt[:16], 4)
    for _ in range(a.rounds):
        p, d, w = strata_round(model, prompt, a.decode, a.reps)
        S_pre.append(p); S_dec.append(d); S_c1.append(w[1]); S_c4.append(w[4])
        p, d = llama_round(llm, prompt, a.decode)
        L_pre.append(p); L_dec.append(d)
    med = statistics.median
    wbytes = bytes_per_token(a.model)
    floor = wbytes / (bw[f"read_gbs_{a.threads}t"] * 1e9)
    res = {
        "model": os.path.basename(a.model), "threads": a.threads, "isa": _core.active_isa(),
        "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
        "host": machine_info(_core.active_isa()), "llama_system_info": llama_print_system_info().decode().strip(),
        "runs": {"strata_prefill_s": S_pre, "strata_decode_s": S_dec, "llama_prefill_s": L_pre, "llama_decode_s": L_dec},
        "load_avg_1m": os.getloadavg()[0], "bandwidth": bw, "prompt": a.prompt,
        "strata": {"prefill_tok_s": a.prompt / med(S_pre), "decode_tok_s": 1 / med(S_dec),
                   "decode_ms": med(S_dec) * 1e3, "C1_ms": med(S_c1) * 1e3, "C4_ms": med(S_c4) * 1e3},
        "llama_cpp": {"prefill_tok_s": a.prompt / med(L_pre), "decode_tok_s": 1 / med(L_dec), "decode_ms": med(L_dec) * 1e3},
        "weight_bytes_per_token": wbytes, "floor_ms": floor * 1e3,
    }
    S, L = res["strata"], res["llama_cpp"]
    res["best"] = {"strata_decode_ms": min(S_dec) * 1e3, "llama_decode_ms": min(L_dec) * 1e3,
                   "strata_prefill_tok_s": a.prompt / min(S_pre), "llama_prefill_tok_s": a.prompt / min(L_pre),
                   "decode_ratio": min(L_dec) / min(S_dec), "prefill_ratio": min(L_pre) / min(S_pre),
                   "c4_over_c1": min(S_c4) / min(S_c1), "floor_over_decode": floor / min(S_dec)}
    res["decode_ratio"] = S["decode_tok_s"] / L["decode_tok_s"]
    res["prefill_ratio"] = S["prefill_tok_s"] / L["prefill_tok_s"]
    res["c4_over_c1"] = S["C4_ms"] / S["C1_ms"]
    res["floor_over_decode"] = floor / med(S_dec)
    print(f"{res['model']}  threads={a.threads}  isa={res['isa']}  load avg {res['load_avg_1m']:.1f}")
    print(f"{describe(res['host'])}; llama.cpp: {res['llama_system_info']}")
    print(f"read bandwidth {bw[f'read_gbs_{a.threads}t']:.1f} GB/s; weights per token {wbytes / 2**20:.1f} MiB "
          f"-> floor {res['floor_ms']:.2f} ms")
    print(f"{'':10} {'prefill tok/s':>14} {'decode tok/s':>13} {'decode ms':>10}")
    print(f"{'strata':10} {S['prefill_tok_s']:14.1f} {S['decode_tok_s']:13.1f} {S['decode_ms']:10.2f}")
    print(f"{'llama.cpp':10} {L['prefill_tok_s']:14.1f} {L['decode_tok_s']:13.1f} {L['decode_ms']:10.2f}")
    print(f"decode ratio {res['decode_ratio']:.2f} (target >= 1.2)   prefill ratio {res['prefill_ratio']:.2f}   "
          f"C(4)/C(1) {res['c4_over_c1']:.2f} (target <= 1.35)   floor/T=1 {res['floor_over_decode']:.2f} (target >= 0.7)")
    B = res["best"]
    print(f"best of rounds: strata decode {B['strata_decode_ms']:.2f} ms, llama.cpp {B['llama_decode_ms']:.2f} ms "
          f"-> ratio {B['decode_ratio']:.2f}; prefill ratio {B['prefill_ratio']:.2f}; C(4)/C(1) {B['c4_over_c1']:.2f}; "
          f"floor/T=1 {B['floor_over_decode']:.2f}")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
