"""A busy machine (issue 17 item 3): decode and prefill tok/s for each thread count while a bounded CPU-bound
program keeps one core busy, strata and llama.cpp side by side, each measurement in its own process.

    python bench/bench_contention.py [MODEL] [--threads 1,2] [--decode 200] [--prompt 256] [--rounds 3] \\
        [--load-cpu 1] [--llama-path DIR] [--json OUT]

MODEL defaults to the shipped default model. The competing load is a Python busy loop pinned to --load-cpu
(default: the last CPU) for the length of one measurement; it is started before the engine loads and killed
after it (and stops by itself after --load-seconds). Rows: every --threads count and the engines' defaults
("default": strata's default_threads() = physical cores; llama.cpp's own default, the physical cores as
llama-cli / llama-bench count them). Engines and thread counts alternate within each round (load from other
programs hits all alike); the table gives medians over rounds. decode tok/s = tokens / total time of --decode
single-token steps (stalls count); prefill tok/s = prompt tokens / the median time of --prefill-reps prefills
(after one that pages the weights in), in 512-row prompt windows.
--llama-path DIR puts a llama-cpp-python built into DIR (pip install --target DIR ...) first on sys.path.
--no-load measures the same rows without the competing program. strata rows record pool_stats() (the adaptive
pool's regions run each way) at the end of each measurement. Targets: strata's default >= 0.9x its best
thread count and >= 1.5x llama.cpp's default, with the load on.
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


def burn(cpu: int, seconds: float) -> None:
    os.sched_setaffinity(0, {cpu})
    t = time.time()
    while time.time() - t < seconds:
        pass


def prefill_seconds(once, reps: int) -> list[float]:
    """The seconds of `reps` prefills after one that pages the weights in (the table takes their median: a
    128-token prompt takes ~50 ms, and the best of two measured the luck of the busy core more than the engine)."""
    once()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        once()
        out.append(time.perf_counter() - t)
    return out


def worker_strata(a) -> dict:
    import numpy as np

    from strata_py import _core
    from strata_py.model import Model
    from strata_py.speculative import prefill
    if a.isa:
        _core.force_isa(a.isa)
    m = Model.load(a.model, threads=a.threads or None)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, min(m.n_vocab, 4096), a.prompt).tolist()
    toks = rng.integers(0, min(m.n_vocab, 4096), a.decode).tolist()
    def once():
        nonlocal s
        s = m.session(n_ctx=a.prompt + a.decode + 8)
        prefill(s, prompt)
    s = None
    pre = prefill_seconds(once, a.prefill_reps)
    steps = []
    t0 = time.perf_counter()
    for tok in toks:
        t = time.perf_counter()
        s.run([tok])
        s.commit(1)
        steps.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    return {"threads": m.threads, "prefill_tok_s": a.prompt / statistics.median(pre), "prefill_s": pre,
            "decode_tok_s": a.decode / total,
            "decode_ms_median": statistics.median(steps) * 1e3, "isa": _core.active_isa(), "pool": m.pool_stats()}


def llama_default_threads() -> int:
    """llama.cpp's default -t (common.cpp cpu_get_num_math: physical cores; hyperthread siblings once)."""
    cores = set()
    for cpu in range(os.cpu_count() or 1):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            pass
    return max(1, len(cores) or (os.cpu_count() or 1))


def worker_llama(a) -> dict:
    if a.llama_path:
        sys.path.insert(0, a.llama_path)
    import numpy as np
    from llama_cpp import Llama, llama_print_system_info
    n = a.threads or llama_default_threads()
    llm = Llama(a.model, n_threads=n, n_threads_batch=n, n_ctx=a.prompt + a.decode + 8, n_batch=512, verbose=False)
    rng = np.random.default_rng(0)
    V = llm.n_vocab()
    prompt = rng.integers(0, min(V, 4096), a.prompt).tolist()
    toks = rng.integers(0, min(V, 4096), a.decode).tolist()
    def once():
        llm.reset()
        llm.eval(prompt)
    pre = prefill_seconds(once, a.prefill_reps)
    steps = []
    t0 = time.perf_counter()
    for tok in toks:
        t = time.perf_counter()
        llm.eval([tok])
        steps.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    return {"threads": n, "prefill_tok_s": a.prompt / statistics.median(pre), "prefill_s": pre,
            "decode_tok_s": a.decode / total,
            "decode_ms_median": statistics.median(steps) * 1e3,
            "system_info": llama_print_system_info().decode(errors="replace").strip()}


def measure(a, engine: str, threads: int, load: bool) -> dict:
    cmd = [sys.executable, HERE, "--worker", engine, "--threads", str(threads), "--decode", str(a.decode),
           "--prompt", str(a.prompt), "--prefill-reps", str(a.prefill_reps)]
    if a.model:
        cmd[2:2] = [a.model]
    if a.llama_path:
        cmd += ["--llama-path", a.llama_path]
    if a.isa:
        cmd += ["--isa", a.isa]
    burner = None
    if load:
        burner = subprocess.Popen([sys.executable, HERE, "--worker", "burn", "--load-cpu", str(a.load_cpu),
                                   "--load-seconds", str(a.load_seconds)])
        time.sleep(0.2)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.load_seconds)
    finally:
        if burner:
            burner.kill()
            burner.wait()
    if r.returncode != 0:
        raise RuntimeError(f"{engine} worker failed ({r.returncode}): {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="GGUF (default: the shipped default model)")
    ap.add_argument("--threads", default=None, help="thread counts, comma-separated (default 1..usable CPUs)")
    ap.add_argument("--decode", type=int, default=200)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-reps", type=int, default=7, help="timed prefills per measurement (their median)")
    ap.add_argument("--load-cpu", type=int, default=None, help="the CPU the competing load takes (default: last)")
    ap.add_argument("--load-seconds", type=float, default=600, help="hard limit of one measurement and its load")
    ap.add_argument("--no-load", action="store_true", help="measure without the competing program")
    ap.add_argument("--engines", default="strata,llama")
    ap.add_argument("--llama-path", default=None)
    ap.add_argument("--isa", default=None, help="strata kernel path (default: the best this CPU has)")
    ap.add_argument("--json")
    ap.add_argument("--worker", choices=("strata", "llama", "burn"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.load_cpu is None:
        a.load_cpu = max(os.sched_getaffinity(0))
    if a.worker == "burn":
        burn(a.load_cpu, a.load_seconds)
        return 0
    if a.worker:
        a.threads = int(a.threads)
        if a.model is None:
            from strata_py.model import default_model_path
            a.model = str(default_model_path())
        print(json.dumps(worker_strata(a) if a.worker == "strata" else worker_llama(a)))
        return 0
    if a.model is None:
        from strata_py.model import default_model_path
        a.model = str(default_model_path())
    counts = [int(x) for x in a.threads.split(",")] if a.threads else list(range(1, len(os.sched_getaffinity(0)) + 1))
    engines = a.engines.split(",")
    for e in engines:
        if e not in ("strata", "llama"):
            ap.error(f"bad option --engines {a.engines!r}: {e!r} is not one of strata, llama")
    configs = [(e, t) for t in [*counts, 0] for e in engines]  # 0 = the engine's default
    load = not a.no_load
    runs: dict = {f"{e}:{t}": [] for e, t in configs}
    info = machine_info(a.isa)
    for r in range(a.rounds):
        order = configs if r % 2 == 0 else configs[::-1]
        for e, t in order:
            res = measure(a, e, t, load)
            runs[f"{e}:{t}"].append(res)
            pool = res.get("pool", {})
            serial = (f", {pool['serial_regions'] / max(1, pool['serial_regions'] + pool['parallel_regions']):.0%} of "
                      f"regions serial" if pool.get("adaptive") else "")
            print(f"round {r + 1} {e:6} threads={'default' if t == 0 else t} ({res['threads']}): decode "
                  f"{res['decode_tok_s']:.1f} tok/s, prefill {res['prefill_tok_s']:.1f} tok/s, "
                  f"load avg {res['load_avg_1m']:.1f}{serial}", flush=True)
    med = statistics.median
    rows = {}
    for key, rs in runs.items():
        rows[key] = {"threads": rs[0]["threads"], "decode_tok_s": med(x["decode_tok_s"] for x in rs),
                     "prefill_tok_s": med(x["prefill_tok_s"] for x in rs),
                     "decode_runs": [x["decode_tok_s"] for x in rs], "prefill_runs": [x["prefill_tok_s"] for x in rs],
                     "load_avg_1m": [x["load_avg_1m"] for x in rs], "pool": [x.get("pool") for x in rs]}
    res = {"model": os.path.basename(a.model), "machine": info, "competing_load_cpu": a.load_cpu if load else None,
           "decode_tokens": a.decode, "prompt_tokens": a.prompt, "rows": rows,
           "llama_system_info": next((x.get("system_info") for x in runs.get(f"llama:{counts[0]}", [])), None)}
    print(f"\n{res['model']}; {describe(info)}; competing load on CPU {a.load_cpu if load else '-'}")
    print(f"{'engine':8} {'threads':>8} {'decode tok/s':>13} {'prefill tok/s':>14}")
    for key, row in rows.items():
        e, t = key.split(":")
        print(f"{e:8} {('default(' + str(row['threads']) + ')') if t == '0' else t:>8} {row['decode_tok_s']:13.1f} "
              f"{row['prefill_tok_s']:14.1f}")
    if "strata" in engines:
        best = {k: max(rows[f"strata:{t}"][k] for t in counts) for k in ("decode_tok_s", "prefill_tok_s")}
        d = rows["strata:0"]
        res["strata_default_over_best"] = {k: d[k] / best[k] for k in best}
        line = (f"strata default / best thread count: decode {res['strata_default_over_best']['decode_tok_s']:.2f}x, "
                f"prefill {res['strata_default_over_best']['prefill_tok_s']:.2f}x (target >= 0.9)")
        if "llama" in engines:
            ld = rows["llama:0"]
            res["strata_default_over_llama_default"] = {k: d[k] / ld[k] for k in best}
            line += (f"; vs llama.cpp's default: decode {res['strata_default_over_llama_default']['decode_tok_s']:.2f}x, "
                     f"prefill {res['strata_default_over_llama_default']['prefill_tok_s']:.2f}x (target >= 1.5)")
        print(line)
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
