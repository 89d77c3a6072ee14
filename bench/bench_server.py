"""The server on a multi-turn coding conversation: time to first token (TTFT) of each turn with prefix reuse,
without it, and llama.cpp's server (llama-cpp-python's `python -m llama_cpp.server`) on the same GGUF and the
same conversation, in the same run; then throughput under concurrent clients.

    python bench/bench_server.py [MODEL.gguf ...] [--threads 2] [--turns 10] [--answer-tokens 32] [--clients 4]
                                 [--json OUT] [--no-llama]

The conversation is scripted, so that every server gets exactly the same prompts: turn k's prompt is the
ChatML render of a system message and k user turns ("Now write X from module Y"), each earlier one followed by
a fixed assistant answer (the source of that stdlib function, as a client would send back its own copy of an
answer), ending with the assistant header. The answers are not the server's own output, as with clients that
keep their own copy of the history (editors, agent frameworks, anything that edits or reformats turns):
a server reuses only what it holds exactly. Each turn streams `--answer-tokens` tokens at temperature 0 through
/v1/completions (the prompt already rendered); TTFT is the time from sending the request to the first text.
Servers are alternated turn by turn (the rotation changes every turn), so background load hits them alike.

Servers: strata with reuse (the defaults), strata with `--prompt-cache-mib 0` (no reuse: every prompt computed
whole), llama.cpp (`--n_ctx` as large as the longest prompt needs; its own prefix reuse, which cannot roll a
hybrid model's recurrent state back, so a turn whose history differs from what it computed is computed whole).
Throughput: `--clients` threads, each sending `--client-requests` short prompts (64 tokens out), per server.
Prints a table and writes JSON (the machine, its CPU flags and load average included).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STDLIB = [("textwrap", "dedent"), ("shlex", "split"), ("difflib", "get_close_matches"), ("json", "dumps"),
          ("base64", "b64encode"), ("fnmatch", "translate"), ("string", "capwords"), ("heapq", "nlargest"),
          ("statistics", "median"), ("glob", "glob"), ("calendar", "isleap"), ("colorsys", "rgb_to_hls")]
ANSWER_CHARS = 700


def conversation(turns: int) -> list[str]:
    """The prompt text of each turn (ChatML, generation header at the end)."""
    import importlib

    sys_msg = "<|im_start|>system\nYou are a careful Python programmer. Answer with code.<|im_end|>\n"
    history, prompts = sys_msg, []
    for k in range(turns):
        mod, fn = STDLIB[k % len(STDLIB)]
        user = f"<|im_start|>user\nNow write `{fn}` from the `{mod}` module, with its docstring.<|im_end|>\n"
        prompts.append(history + user + "<|im_start|>assistant\n")
        src = inspect.getsource(getattr(importlib.import_module(mod), fn))[:ANSWER_CHARS]
        history += user + "<|im_start|>assistant\n" + src + "<|im_end|>\n"
    return prompts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name: str, argv: list[str], port: int):
        self.name, self.port = name, port
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}/v1"

    def ready(self, timeout=600) -> "Proc":
        import urllib.request
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as r:
                    self.model_id = json.loads(r.read())["data"][0]["id"]
                    return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")

    def client(self):
        import openai
        return openai.OpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=3600)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()


def start_servers(model: str, threads: int, ctx: int, with_llama: bool) -> list[Proc]:
    py = sys.executable
    common = ["--model", model, "--threads", str(threads), "--ctx", str(ctx), "--temperature", "0", "--dry-multiplier", "0"]
    procs = [Proc("strata", [py, "-m", "strata_py.serve", *common, "--port", str(p := free_port())], p),
             Proc("strata-no-reuse", [py, "-m", "strata_py.serve", *common, "--prompt-cache-mib", "0",
                                      "--port", str(q := free_port())], q)]
    if with_llama:
        r = free_port()
        procs.append(Proc("llama.cpp", [py, "-m", "llama_cpp.server", "--model", model, "--n_ctx", str(ctx),
                                        "--n_threads", str(threads), "--n_threads_batch", str(threads),
                                        "--host", "127.0.0.1", "--port", str(r)], r))
    return [p.ready() for p in procs]


def one_turn(proc: Proc, prompt: str, n: int) -> dict:
    c = proc.client()
    t0 = time.perf_counter()
    first, text = None, []
    for ch in c.completions.create(model=proc.model_id, prompt=prompt, max_tokens=n, temperature=0.0, stream=True):
        if ch.choices and ch.choices[0].text:
            if first is None:
                first = time.perf_counter() - t0
            text.append(ch.choices[0].text)
    total = time.perf_counter() - t0
    return {"ttft_s": first if first is not None else total, "total_s": total, "chars": len("".join(text))}


def throughput(proc: Proc, prompts: list[str], clients: int, per_client: int, n: int) -> dict:
    out_tokens, errors = [0], []
    lock = threading.Lock()

    def run(i):
        c = proc.client()
        for j in range(per_client):
            try:
                r = c.completions.create(model=proc.model_id, prompt=prompts[(i * per_client + j) % len(prompts)],
                                         max_tokens=n, temperature=0.0)
                with lock:
                    out_tokens[0] += r.usage.completion_tokens
            except Exception as e:  # noqa: BLE001  (a bench records failures instead of dying)
                errors.append(repr(e))
    t0 = time.perf_counter()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    return {"tokens": out_tokens[0], "wall_s": wall, "tok_s": out_tokens[0] / wall, "errors": errors}


def bench_model(model: str, a) -> dict:
    prompts = conversation(a.turns)
    from strata_py.model import Model
    tok = Model.load(model, threads=1).tokenizer
    n_prompt = [len(tok.encode(p)) for p in prompts]
    ctx = max(n_prompt) + a.answer_tokens + 64
    procs = start_servers(model, a.threads, ctx, not a.no_llama)
    try:
        ttft = {p.name: [] for p in procs}
        for k, prompt in enumerate(prompts):
            order = procs[k % len(procs):] + procs[:k % len(procs)]
            for p in order:
                ttft[p.name].append(one_turn(p, prompt, a.answer_tokens))
                time.sleep(0.2)
                print(f"  turn {k + 1:2d} ({n_prompt[k]:5d} tokens) {p.name:16s} TTFT {ttft[p.name][-1]['ttft_s'] * 1e3:8.1f} ms",
                      file=sys.stderr, flush=True)
        short = [f"<|im_start|>user\nWrite `{fn}` from `{mod}`.<|im_end|>\n<|im_start|>assistant\n" for mod, fn in STDLIB]
        tput = {}
        for rnd in range(a.rounds):
            for p in (procs if rnd % 2 == 0 else procs[::-1]):
                if p.name == "strata-no-reuse":
                    continue
                tput.setdefault(p.name, []).append(throughput(p, short, a.clients, a.client_requests, 64))
    finally:
        for p in procs:
            p.stop()
    return {"model": model, "prompt_tokens": n_prompt, "ttft": ttft, "throughput": tput}


def summarize(r: dict) -> dict:
    s = {}
    for name, turns in r["ttft"].items():
        t = [x["ttft_s"] for x in turns]
        s[name] = {"ttft_ms": [round(x * 1e3, 1) for x in t], "turn_last_over_turn2": t[-1] / t[1] if len(t) > 1 else None}
    if "llama.cpp" in s:
        s["strata_over_llama_last_turn"] = r["ttft"]["strata"][-1]["ttft_s"] / r["ttft"]["llama.cpp"][-1]["ttft_s"]
    s["throughput_tok_s"] = {k: max(x["tok_s"] for x in v) for k, v in r["throughput"].items()}
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="GGUF files (default: the shipped model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--client-requests", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="throughput rounds (alternated)")
    ap.add_argument("--no-llama", action="store_true", help="without llama.cpp's server")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if not a.no_llama:
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError:
            print("llama-cpp-python[server] is not installed: --no-llama, or pip install 'llama-cpp-python[server]'",
                  file=sys.stderr)
            return 2
    from strata_py.model import default_model_path
    models = a.models or [str(default_model_path())]
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": platform.platform(),
           "cpu": _cpu(), "load_average": os.getloadavg(), "args": vars(a), "models": []}
    from rich.console import Console
    from rich.table import Table
    for m in models:
        print(f"{m}:", file=sys.stderr)
        r = bench_model(m, a)
        r["summary"] = summarize(r)
        out["models"].append(r)
        t = Table(title=f"{Path(m).name}: TTFT ms per turn (prompt tokens)")
        t.add_column("turn")
        for name in r["ttft"]:
            t.add_column(name, justify="right")
        for k in range(a.turns):
            t.add_row(f"{k + 1} ({r['prompt_tokens'][k]})", *[f"{r['ttft'][n][k]['ttft_s'] * 1e3:.1f}" for n in r["ttft"]])
        sm = r["summary"]
        t.add_row("turn last / turn 2", *[f"{sm[n]['turn_last_over_turn2']:.2f}x" for n in r["ttft"]])
        Console().print(t)
        if "strata_over_llama_last_turn" in sm:
            print(f"strata / llama.cpp TTFT, turn {a.turns}: {sm['strata_over_llama_last_turn']:.3f}x")
        print("throughput, %d clients x %d requests: %s" % (a.clients, a.client_requests, ", ".join(
            f"{k} {v:.1f} tok/s" for k, v in sm["throughput_tok_s"].items())))
    out["load_average_end"] = os.getloadavg()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


def _cpu() -> dict:
    info = {}
    try:
        txt = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in txt.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Flags"):
                info[k.strip()] = v.strip()
    except OSError:
        pass
    return info


if __name__ == "__main__":
    sys.exit(main())
