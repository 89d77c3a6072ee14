"""llama.cpp's CUDA build on the same model files as strata's GPU benches, in the same device call (issue 19):
`llama-bench -ngl 99` pp512 and tg128 (-r 3) on every MODEL, and tg64 with the routed experts on the CPU
(`-ot exps=CPU`, llama.cpp's way of keeping experts in host memory) on every --experts-on-cpu file.

    python bench/bench_llama_cuda.py --bin BUILD/bin/llama-bench MODEL.gguf [MODEL2.gguf ...]
        [--experts-on-cpu MODEL.gguf] [--build-status DIR/status] [--build-paused-s S] [--deadline-s 120] [--json OUT]

Runs go in this order (the most wanted first): every MODEL resident, then the --experts-on-cpu runs. Each run is
one llama-bench process with `-o jsonl` (a test's line is printed when it ends, so a run stopped by the deadline
keeps the tests it finished); no run starts after --deadline-s seconds from the start, and a started run is
stopped at the deadline. --build-status: the status file of tools/llama_cuda_build.sh ("RC SECONDS"), recorded
as the build's exit status (-1: stopped unfinished) and wall seconds, of which --build-paused-s it was paused
(tools/gpu_check.sh stops it while strata's timed benches run). Rows: model file, the arguments, pp / tg tok/s (llama-bench's avg_ts,
the mean over its repetitions, and samples_ts), the build commit llama-bench reports, the GPU it saw.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info, write_json  # noqa: E402

RESIDENT = ["-ngl", "99", "-p", "512", "-n", "128", "-r", "3"]
EXPERTS_ON_CPU = ["-ngl", "99", "-ot", "exps=CPU", "-p", "0", "-n", "64", "-r", "3"]


def parse_jsonl(text: str) -> list[dict]:
    """llama-bench -o jsonl's tests (one JSON object a line; other lines, e.g. a cut-off last one, skipped)."""
    tests = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                tests.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return tests


def row(model: str, args: list[str], tests: list[dict], rc: int | None, seconds: float, err: str) -> dict:
    r = {"model": Path(model).name, "args": " ".join(args), "rc": rc, "seconds": round(seconds, 1)}
    for t in tests:
        kind = "pp" if t.get("n_gen", 0) == 0 else "tg"
        n = t["n_prompt"] if kind == "pp" else t["n_gen"]
        r[f"{kind}{n}_tok_s"] = t["avg_ts"]
        r[f"{kind}{n}_stddev"] = t.get("stddev_ts")
        r[f"{kind}{n}_samples"] = t.get("samples_ts")
        for k in ("build_commit", "gpu_info", "backends", "model_type", "model_size", "model_n_params", "flash_attn",
                  "n_threads", "n_gpu_layers"):
            if k in t:
                r[k] = t[k]
    if rc != 0:
        r["error"] = ("stopped at the deadline" if rc is None else f"rc {rc}") + (f": {err}" if err else "")
    return r


def run_one(binary: str, model: str, args: list[str], left_s: float) -> dict:
    cmd = [binary, "-m", model, *args, "-o", "jsonl"]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left_s)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = None
    r = row(model, args, parse_jsonl(out), rc, time.perf_counter() - t0,
            "" if rc == 0 else " | ".join(err.strip().splitlines()[-3:]))
    print(json.dumps({k: v for k, v in r.items() if not k.endswith("_samples")}), flush=True)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="files for the resident runs (pp512, tg128)")
    ap.add_argument("--bin", required=True, help="llama-bench")
    ap.add_argument("--experts-on-cpu", action="append", default=[], metavar="MODEL",
                    help="a file for the -ot exps=CPU tg64 run (repeatable)")
    ap.add_argument("--build-status", help="tools/llama_cuda_build.sh's status file (RC SECONDS)")
    ap.add_argument("--build-paused-s", type=int, default=None, help="seconds of the build's wall time it was paused")
    ap.add_argument("--deadline-s", type=float, default=600.0, help="start no run after this many seconds")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = {"llama_cpp": "llama-cpp-python 0.3.36 vendor/llama.cpp, CUDA build (tools/llama_cuda_build.sh)",
           "machine": machine_info(), "build_rc": None, "build_seconds": None, "build_paused_s": a.build_paused_s,
           "runs": [], "not_run": []}
    if a.build_status and Path(a.build_status).exists():
        rc, secs = Path(a.build_status).read_text().split()
        res["build_rc"], res["build_seconds"] = int(rc), int(secs)
    if not Path(a.bin).is_file():
        print(f"bench_llama_cuda: no llama-bench at {a.bin}", file=sys.stderr)
        res["not_run"] = [{"model": Path(m).name, "args": " ".join(x), "why": f"no llama-bench at {a.bin}"}
                          for m, x in [(m, RESIDENT) for m in a.models] + [(m, EXPERTS_ON_CPU)
                                                                           for m in a.experts_on_cpu]]
        write_json(a.json, res)
        return 2
    for model, args in [(m, RESIDENT) for m in a.models] + [(m, EXPERTS_ON_CPU) for m in a.experts_on_cpu]:
        left = a.deadline_s - (time.perf_counter() - t0)
        if left < 5:
            res["not_run"].append({"model": Path(model).name, "args": " ".join(args), "why": "past the deadline"})
            continue
        res["runs"].append(run_one(a.bin, model, args, left))
        write_json(a.json, res)
    write_json(a.json, res)
    return 0 if res["runs"] and all("error" not in r for r in res["runs"]) and not res["not_run"] else 1


if __name__ == "__main__":
    sys.exit(main())
