"""The model forward on the GPU (issue 19, third milestone): decode tok/s at T = 1 and the cost of a verify window
C(T) / C(1) for T = 1, 2, 4, 8, 16, per model file, on backend="cuda" (weights and state on the card), plus the
weight bytes one T = 1 step reads and the fraction of the HBM floor that is (bytes / step time / bandwidth).

    python bench/bench_gpu_forward.py MODEL.gguf [MODEL2.gguf ...] [--reps 30] [--bw-gbs 4300] [--json OUT]
        [--stream MODEL.gguf:0.25 ...] [--prompt 512[,4096]] [--backend cuda] [--launches on,off]

Each timed step is Session.run(T tokens) + commit(T) after a 64-token prompt (commit(T) keeps every row: no replay),
wall clock over --reps steps after 3 warm-up steps, median of 3 rounds; run() returns after the logits are on the
host (the sampler's input). Bytes per step: every tensor except the routed experts, plus n_expert_used / n_expert
of the routed experts' bytes (the experts one row reads; random routing reads about that). --bw-gbs: the HBM
bandwidth of the floor (default: the device-to-device copy bandwidth measured here, read + write).
Prefill: a --prompt-token prompt (512, as llama-bench's pp512) as one prompt window on a new session, the last
row's logits only (generate's prefill), median of 3 after one warm-up; prefill_tok_s = tokens / that time (0 skips).
A comma list (512,4096) times each length: prefill_tok_s is the first's, prefill_by_tokens has every one.
--backend cpu-backend runs the resident rows over the CPU backend (a local check of this bench; give --bw-gbs).
--launches on,no-prefetch,off: an A/B of the kernel launches (programmatic dependent launch and the dense products'
weight prefetch, csrc/kernels/cuda/launch.cuh) on the same loaded model, the modes alternating in every round, each
on its own sessions (recorded steps keep the mode they were recorded in): a row per mode.

--stream FILE:FRAC[:on|off][:auto|host|file] (repeatable): the same file with the routed experts streamed (from
pinned host memory or the file: the spec's source, else --expert-source, default auto) into a GPU budget of FRAC of their bytes (Model.load(cache_mib=...), csrc/model/backend_experts.h), prefetch on and off
(or only the one named): T = 1
decode tok/s (after a 64-token prompt and 32 warm-up steps, so the cache is in its steady state), C(4) / C(1), the
bytes copied to the card per token, hit rate and prefetch precision / recall (rows under "streamed").
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_modes import LAUNCH_MODES, set_launches  # noqa: E402
from machine import write_json  # noqa: E402
from strata_py import _core  # noqa: E402
from strata_py.model import Model  # noqa: E402

TS = [1, 2, 4, 8, 16]


def tensor_bytes(path: str) -> tuple[int, int, int]:
    """(bytes of every tensor a step reads whole, of the routed experts, of the file's tensors)."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    total = dense = experts = 0
    for t in r.tensors:
        n = int(t.n_bytes)
        total += n
        if "_exps." in t.name:
            experts += n
        elif t.name != "token_embd.weight" or not any(x.name == "output.weight" for x in r.tensors):
            dense += n  # token_embd is read for T rows only; without output.weight it is the head
    return dense, experts, total


def prompted_session(m, rng):
    """A session of m (its load's backend) after a 64-token random prompt."""
    s = m.session(n_ctx=4096, max_window=16)
    s.run(rng.integers(0, m.n_vocab, 64).tolist())
    s.commit(64)
    return s


def time_steps(s, V, T, reps, rng) -> float:
    for _ in range(3):
        s.run(rng.integers(0, V, T).tolist())
        s.commit(T)
    t0 = time.perf_counter()
    for _ in range(reps):
        s.run(rng.integers(0, V, T).tolist())
        s.commit(T)
    return (time.perf_counter() - t0) / reps


def time_prefill(m, V: int, n: int, rng) -> float:
    """Median seconds of an n-token prompt on a new session (one prompt window, last row's logits), 1 warm-up."""
    times = []
    for i in range(4):
        s = m.session(n_ctx=max(4096, n + 1), max_window=16)
        tokens = rng.integers(0, V, n).tolist()
        t0 = time.perf_counter()
        s.run(tokens, last_only=True)
        s.commit(n)
        times.append(time.perf_counter() - t0)
        del s
        if i == 1 and times[0] > 20:  # a slow prefill: the warm-up and one timed run
            break
    return float(np.median(times[1:]))


def bench_model(path: str, reps: int, bw: float, prompts: tuple[int, ...] = (), backend: str = "cuda",
                launches: tuple[str, ...] = ("on",)) -> list[dict]:
    """One row per launch mode (launch_modes.py), the modes alternating within each round on the same loaded model,
    each mode on its own sessions."""
    def set_mode(mode):
        if backend == "cuda":
            set_launches(mode)
    t0 = time.perf_counter()
    m = Model.load(path, backend=backend)
    cfg = m.config
    V = m.n_vocab
    rng = np.random.default_rng(0)
    sessions = {}
    for mode in launches:
        set_mode(mode)
        sessions[mode] = prompted_session(m, rng)
    load_s = time.perf_counter() - t0
    per = {mode: {T: [] for T in TS} for mode in launches}
    for _ in range(3):  # rounds, the launch modes and window sizes alternating
        for mode in launches:
            set_mode(mode)
            for T in TS:
                per[mode][T].append(time_steps(sessions[mode], V, T, reps if T == 1 else max(5, reps // 2), rng))
                if sessions[mode].position > 3500:
                    sessions[mode] = prompted_session(m, rng)
    sessions.clear()
    pre = {mode: {n: [] for n in prompts} for mode in launches}
    for _ in range(1 if len(launches) == 1 else 2):
        for mode in launches:
            set_mode(mode)
            for n in prompts:
                pre[mode][n].append(time_prefill(m, V, n, rng))
    set_mode("on")
    dense, experts, total = tensor_bytes(path)
    nb = dense + experts * cfg["n_expert_used"] // cfg["n_expert"]  # the bytes a T = 1 step reads
    rows = []
    for mode in launches:
        med = {T: float(np.median(v)) for T, v in per[mode].items()}
        res = {"model": Path(path).name, "launches": mode, "file_gib": total / 2**30, "load_and_prompt_s": load_s,
               "step_s": {str(T): med[T] for T in TS}, "decode_tok_s": 1 / med[1],
               "c_over_c1": {str(T): med[T] / med[1] for T in TS}, "step_bytes": nb,
               "hbm_floor_fraction": nb / med[1] / bw, "bw_gbs": bw / 1e9}
        if prompts:
            by = {str(n): n / float(np.median(pre[mode][n])) for n in prompts}
            res["prefill_tokens"] = prompts[0]
            res["prefill_tok_s"] = by[str(prompts[0])]
            res["prefill_by_tokens"] = by
        print(f"{res['model']} (launches {mode}): {res['file_gib']:.2f} GiB, decode {res['decode_tok_s']:.1f} tok/s "
              f"({med[1] * 1e3:.2f} ms/step, {nb / 1e9:.3f} GB/step = {100 * res['hbm_floor_fraction']:.1f} % of the "
              f"{bw / 1e9:.0f} GB/s floor); C(T)/C(1): " +
              ", ".join(f"T={T} {med[T] / med[1]:.2f}" for T in TS) +
              "".join(f"; prefill {n} tokens {v:.0f} tok/s" for n, v in res.get("prefill_by_tokens", {}).items()),
              flush=True)
        rows.append(res)
    return rows


def bench_streamed(path: str, frac: float, prefetch: bool, reps: int, backend: str = "cuda",
                   source: str = "auto") -> dict:
    t0 = time.perf_counter()
    mib = max(1, int(frac * tensor_bytes(path)[1] / 2**20))
    m = Model.load(path, backend=backend, cache_mib=mib, prefetch=prefetch, expert_source=source)
    V = m.n_vocab
    rng = np.random.default_rng(0)
    s = prompted_session(m, rng)
    load_s = time.perf_counter() - t0
    time_steps(s, V, 1, 32, rng)  # warm: the cache's steady state
    m.reset_expert_stats()
    pos0 = s.position  # every step commits all its rows: rows run since the reset = positions advanced
    one, four = [], []
    for _ in range(3):
        one.append(time_steps(s, V, 1, reps, rng))
        four.append(time_steps(s, V, 4, max(5, reps // 2), rng))
    st = m.expert_stats()
    tokens = s.position - pos0
    c1, c4 = float(np.median(one)), float(np.median(four))
    res = {"model": Path(path).name, "cache_frac": frac, "cache_mib": mib, "prefetch": prefetch,
           "load_and_prompt_s": load_s, "decode_tok_s": 1 / c1, "step_s": {"1": c1, "4": c4}, "c4_over_c1": c4 / c1,
           "copied_bytes_per_row": st["bytes_read"] / tokens, "hit_rate": st["hit_rate"],
           "prefetch_precision": st["prefetch_precision"], "prefetch_recall": st["prefetch_recall"],
           "union_mean": st["union_mean"], "slots": st["slots"], "experts_total": st["experts_total"],
           "source": st["source"]}
    print(f"{res['model']} streamed at {100 * frac:.0f} % ({mib} MiB from {st['source']}, prefetch "
          f"{'on' if prefetch else 'off'}): "
          f"decode {res['decode_tok_s']:.1f} tok/s, C(4)/C(1) {res['c4_over_c1']:.2f}, "
          f"{res['copied_bytes_per_row'] / 1e6:.1f} MB copied a row, hit rate {res['hit_rate']:.2f}, prefetch "
          f"precision {res['prefetch_precision']:.2f} recall {res['prefetch_recall']:.2f}", flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--bw-gbs", type=float, default=None)
    ap.add_argument("--json")
    ap.add_argument("--stream", action="append", default=[], metavar="FILE:FRAC")
    ap.add_argument("--prompt", default="512", help="prefill prompt tokens, a comma list (0: no prefill row)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu-backend"))
    ap.add_argument("--expert-source", default="auto", choices=("auto", "host", "file"),
                    help="--stream rows: where missing experts are copied from (Model.load's expert_source)")
    ap.add_argument("--dp4a", action="store_true",
                    help="IQ2_XXS products of 5+ rows and expert tiles on the dp4a kernels, not the tensor cores "
                         "(the same bits; for A/B runs)")
    ap.add_argument("--mma-min-rows", type=int, default=5,
                    help="dense IQ2_XXS products of this many rows or more on the tensor cores (default 5)")
    ap.add_argument("--launches", default="on",
                    help="comma list of kernel launch modes, alternated on each loaded model, a row each: on "
                         "(programmatic dependent launch + the dense weight prefetch, the default), no-prefetch, off")
    a = ap.parse_args(argv)
    launches = tuple(a.launches.split(","))
    try:
        prompts = tuple(int(v) for v in a.prompt.split(","))
    except ValueError:
        prompts = (-1,)
    if any(n < 0 for n in prompts):
        ap.error(f"bad option --prompt {a.prompt!r}: a comma list of token counts (0: no prefill row)")
    prompts = tuple(n for n in prompts if n > 0)
    bad = [x for x in launches if x not in LAUNCH_MODES]
    if bad or len(set(launches)) != len(launches):
        ap.error(f"bad option --launches {a.launches!r}: a comma list of distinct {', '.join(LAUNCH_MODES)}")
    streams = []
    for spec in a.stream:
        f, _, frac = spec.rpartition(":")
        source = a.expert_source
        if frac in ("auto", "host", "file"):
            source = frac
            f, _, frac = f.rpartition(":")
        pf = (True, False)
        if frac in ("on", "off"):
            pf = (frac == "on",)
            f, _, frac = f.rpartition(":")
        try:
            streams.append((f, float(frac), pf, source))
        except ValueError:
            ap.error(f"bad option --stream {spec!r}: expected FILE:FRACTION[:on|off][:auto|host|file] (e.g. "
                     "model.gguf:0.25)")
    if a.backend == "cuda" and not _core.cuda_available():
        print(f"bench_gpu_forward: no CUDA device ({_core.cuda_info()})", file=sys.stderr)
        return 2
    if a.bw_gbs:
        bw = a.bw_gbs * 1e9
    elif a.backend != "cuda":
        ap.error(f"--backend {a.backend} needs --bw-gbs (the copy bandwidth is measured on the GPU)")
    else:
        med, _ = _core.cuda_bench_copy(1 << 30, 5)
        bw = 2 * (1 << 30) / med
    if a.backend == "cuda":
        _core.cuda_prefer_mma(not a.dp4a, a.mma_min_rows)
    device = _core.backend_name("cuda") if a.backend == "cuda" else "cpu-backend (the backend forward on the CPU)"
    res = {"device": device, "bw_gbs": bw / 1e9, "tensor_cores": _core.cuda_mma_used(), "models": [], "streamed": []}
    for p in a.models:
        try:
            res["models"] += bench_model(p, a.reps, bw, prompts, a.backend, launches)
        except Exception as e:  # one file failing must not lose the others' rows
            print(f"{p}: {type(e).__name__}: {e}", flush=True)
            res["models"].append({"model": Path(p).name, "error": f"{type(e).__name__}: {e}"})
        write_json(a.json, res)
    for p, frac, pf, source in streams:
        for prefetch in pf:
            try:
                res["streamed"].append(bench_streamed(p, frac, prefetch, a.reps, a.backend, source))
            except Exception as e:
                print(f"{p} streamed: {type(e).__name__}: {e}", flush=True)
                res["streamed"].append({"model": Path(p).name, "cache_frac": frac, "prefetch": prefetch,
                                        "error": f"{type(e).__name__}: {e}"})
            write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
