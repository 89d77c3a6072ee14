"""80B-class files larger than RAM (issue 17 item 4): decode tok/s, bytes read per token, peak RSS and time to
first token for strata with every expert mapped and with --cache-mib at fractions of the expert bytes, and
llama.cpp (mmap) on the same file, each configuration in its own process, alternated over rounds.

    python -m strata_py.synth 80b /data/80b-q4_k_m.gguf --type q4_k_m         # ~45 GB, streamed to disk
    python bench/bench_big.py /data/80b-q4_k_m.gguf [--budgets full,25,10] [--tokens 8] [--prompt 16] \\
        [--rounds 2] [--threads 2] [--llama-path DIR] [--json OUT]

Per configuration: load time; TTFT = time from the loaded model to the logits of the first new token (a
--prompt-token prompt window); decode = --tokens greedy single-token steps after it: tok/s (median step and
mean), bytes read per token from /proc/self/io read_bytes (storage reads of the process: page faults of the
mapping and pread / O_DIRECT of the expert stream alike) and, for strata's stream, its own counters; peak RSS
(VmHWM from /proc/self/status, at the end) against the budget. Targets: at 25 % of the expert bytes strata
>= 2x llama.cpp's tok/s and peak RSS <= budget + 2 GiB.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe, machine_info, write_json  # noqa: E402

HERE = os.path.abspath(__file__)
MIB = 1 << 20


def proc_io() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def expert_bytes(path: str) -> int:
    import gguf
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if "_exps" in t.name)


def worker_strata(a) -> dict:
    import numpy as np

    from strata_py import _core
    from strata_py.model import Model
    mib = None if a.budget == "full" else max(1, int(expert_bytes(a.model) * float(a.budget) / 100 / MIB))
    t = time.perf_counter()
    m = Model.load(a.model, threads=a.threads or None, cache_mib=mib, o_direct=a.o_direct)
    load_s = time.perf_counter() - t
    prompt = np.random.default_rng(0).integers(0, min(m.n_vocab, 4096), a.prompt).tolist()
    s = m.session(n_ctx=a.prompt + a.tokens + 8)
    io0 = proc_io()
    t = time.perf_counter()
    logits = s.run(prompt, last_only=True)
    s.commit(len(prompt))
    ttft = time.perf_counter() - t
    tok = int(np.argmax(logits[-1]))
    e0, io1 = m.expert_stats(), proc_io()
    steps = []
    for _ in range(a.tokens):
        t = time.perf_counter()
        tok = int(np.argmax(s.run([tok])[0]))
        s.commit(1)
        steps.append(time.perf_counter() - t)
    e1, io2 = m.expert_stats(), proc_io()
    r = {"engine": "strata", "budget": a.budget, "cache_mib": mib, "load_s": load_s, "ttft_s": ttft,
         "prefill_read_bytes": io1 - io0, "decode_read_bytes_per_token": (io2 - io1) / a.tokens,
         "s_per_token_median": statistics.median(steps), "s_per_token_mean": sum(steps) / len(steps),
         "peak_rss_bytes": peak_rss(), "threads": m.threads, "isa": _core.active_isa()}
    if e1.get("streaming"):
        r["stream_bytes_read_per_token"] = (e1["bytes_read"] - e0["bytes_read"]) / a.tokens
        r["hit_rate"] = (e1["hits"] - e0["hits"]) / max(1, e1["lookups"] - e0["lookups"])
        r["late_wait_ms_per_token"] = (e1["late_wait_s"] - e0["late_wait_s"]) / a.tokens * 1e3
    return r


def worker_llama(a) -> dict:
    if a.llama_path:
        sys.path.insert(0, a.llama_path)
    import numpy as np
    import llama_cpp.llama_cpp as lc
    from llama_cpp import Llama, llama_print_system_info
    # A file larger than memory cannot be repacked (llama.cpp copies repackable weights into a CPU_REPACK
    # buffer: 35 GB for the 45 GB Q4_K_M file, and the load fails); a llama.cpp user turns repacking off
    # (--no-repack), which keeps every weight in the mapping.
    with open("/proc/meminfo") as f:
        avail = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable"))
    repack = os.path.getsize(a.model) < avail
    if not repack:
        default_params = lc.llama_model_default_params

        def no_repack():
            p = default_params()
            p.use_extra_bufts = False
            return p
        lc.llama_model_default_params = no_repack
    t = time.perf_counter()
    n = a.threads or None
    llm = Llama(a.model, n_threads=n, n_threads_batch=n, n_ctx=a.prompt + a.tokens + 8, n_batch=512,
                use_mmap=True, verbose=False)
    load_s = time.perf_counter() - t
    prompt = np.random.default_rng(0).integers(0, min(llm.n_vocab(), 4096), a.prompt).tolist()
    io0 = proc_io()
    t = time.perf_counter()
    llm.eval(prompt)
    ttft = time.perf_counter() - t
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    io1 = proc_io()
    steps = []
    for _ in range(a.tokens):
        t = time.perf_counter()
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        steps.append(time.perf_counter() - t)
    io2 = proc_io()
    return {"engine": "llama.cpp", "budget": "mmap", "repack": repack, "load_s": load_s, "ttft_s": ttft,
            "prefill_read_bytes": io1 - io0, "decode_read_bytes_per_token": (io2 - io1) / a.tokens,
            "s_per_token_median": statistics.median(steps), "s_per_token_mean": sum(steps) / len(steps),
            "peak_rss_bytes": peak_rss(), "threads": llm.n_threads,
            "system_info": llama_print_system_info().decode(errors="replace").strip()}


def measure(a, engine: str, budget: str) -> dict:
    cmd = [sys.executable, HERE, a.model, "--worker", engine, "--budget", budget, "--tokens", str(a.tokens),
           "--prompt", str(a.prompt), "--threads", str(a.threads)]
    if a.llama_path:
        cmd += ["--llama-path", a.llama_path]
    if a.o_direct:
        cmd += ["--o-direct"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{engine} {budget} failed ({r.returncode}): {r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["load_avg_1m"] = os.getloadavg()[0]
    with open("/proc/meminfo") as f:
        out["mem_available_after"] = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--budgets", default="full,25,10", help="strata: full (every expert mapped) and/or %% of expert bytes")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="0: each engine's default")
    ap.add_argument("--o-direct", action="store_true", help="strata's stream bypasses the page cache")
    ap.add_argument("--engines", default="strata,llama")
    ap.add_argument("--llama-path", default=None)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json")
    ap.add_argument("--worker", choices=("strata", "llama"), help=argparse.SUPPRESS)
    ap.add_argument("--budget", default="full", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker_strata(a) if a.worker == "strata" else worker_llama(a)))
        return 0
    eb = expert_bytes(a.model)
    configs = []
    if "strata" in a.engines:
        configs += [("strata", b) for b in a.budgets.split(",")]
    if "llama" in a.engines:
        configs += [("llama", "mmap")]
    info = machine_info()
    with open("/proc/meminfo") as f:
        mem_total = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemTotal"))
    runs: dict = {f"{e}:{b}": [] for e, b in configs}
    for r in range(a.rounds):
        for e, b in (configs if r % 2 == 0 else configs[::-1]):
            res = measure(a, e, b)
            runs[f"{e}:{b}"].append(res)
            print(f"round {r + 1} {e:9} {b:5}: {1 / res['s_per_token_median']:.3f} tok/s (mean "
                  f"{1 / res['s_per_token_mean']:.3f}), TTFT {res['ttft_s']:.1f} s, "
                  f"{res['decode_read_bytes_per_token'] / MIB:.0f} MiB read/token, peak RSS "
                  f"{res['peak_rss_bytes'] / 2**30:.2f} GiB, load avg {res['load_avg_1m']:.1f}", flush=True)
    med = statistics.median
    rows = {}
    for key, rs in runs.items():
        row = {k: med(x[k] for x in rs) for k in ("s_per_token_median", "s_per_token_mean", "ttft_s", "load_s",
                                                  "decode_read_bytes_per_token", "peak_rss_bytes")}
        row["tok_s"] = 1 / row["s_per_token_median"]
        row["cache_mib"] = rs[0].get("cache_mib")
        row["runs"] = rs
        rows[key] = row
    res = {"model": os.path.basename(a.model), "file_bytes": os.path.getsize(a.model), "expert_bytes": eb,
           "mem_total": mem_total, "machine": info, "tokens": a.tokens, "prompt": a.prompt, "rows": rows}
    print(f"\n{res['model']}: {res['file_bytes'] / 2**30:.1f} GiB ({eb / 2**30:.1f} GiB experts); RAM "
          f"{mem_total / 2**30:.1f} GiB; {describe(info)}")
    print(f"{'config':16} {'tok/s':>7} {'TTFT s':>7} {'MiB read/tok':>13} {'peak RSS GiB':>13} {'budget GiB':>11}")
    for key, row in rows.items():
        budget = (row["cache_mib"] or 0) / 1024
        print(f"{key:16} {row['tok_s']:7.3f} {row['ttft_s']:7.1f} {row['decode_read_bytes_per_token'] / MIB:13.0f} "
              f"{row['peak_rss_bytes'] / 2**30:13.2f} {budget:11.2f}")
    if "strata:25" in rows and "llama:mmap" in rows:
        s25, ll = rows["strata:25"], rows["llama:mmap"]
        res["ratio_25_vs_llama"] = s25["tok_s"] / ll["tok_s"]
        res["rss_over_budget_gib"] = (s25["peak_rss_bytes"] - s25["cache_mib"] * MIB) / 2**30
        print(f"strata at 25 %: {res['ratio_25_vs_llama']:.2f}x llama.cpp's tok/s (target >= 2); peak RSS "
              f"budget + {res['rss_over_budget_gib']:.2f} GiB (target <= 2)")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
