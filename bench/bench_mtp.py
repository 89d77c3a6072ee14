"""MTP drafting (issue 8): acceptance per draft depth and tok/s on the default model, and the cost split of
drafting vs verifying on a larger model.

    python bench/bench_mtp.py [--model M.gguf] [--threads 2] [--max-tokens 128] [--json OUT]
    python bench/bench_mtp.py --cost-model BENCH_MTP.gguf        # synth bench --mtp: draft ms vs verify ms

Part 1 (default: the shipped model): greedy decoding from the held-out snippets of
tools/default_model_run/heldout_snippets.json (code the model never trained on), plain vs MTP with a fixed
k = 1, 2, 3 (fixed_t = k + 1), the controller's choice (`mtp`), `mtp+suffix`, and `auto` (suffix lookup) for
comparison, every variant in turn per prompt; acceptance per draft depth, tokens per window, decode tok/s
(drafting included; the MTP block's pass over the prompt is prefill), output identical to plain.
Part 2 (--cost-model): on a model with an MTP block, the median time of mtp_draft(k) for k = 1..3 and of a
verify window at T = 2, 3, 4 next to one plain T = 1 step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from strata_py.config import GenerationConfig
from strata_py.generate import generate_ids, make_proposer
from strata_py.model import Model, default_model_path, sampling_params
from strata_py.speculative import LoopStats

SNIPPETS = Path(__file__).resolve().parent.parent / "tools" / "default_model_run" / "heldout_snippets.json"


def run(model, ids, cfg):
    st = LoopStats()
    prop = make_proposer(model, cfg)
    out = list(generate_ids(model, ids, cfg, stats=st, proposer=prop))
    d = st.as_dict()
    if prop is not None and hasattr(prop, "stats"):
        d.update(prop.stats())
    return out, d


def acceptance_part(model, a) -> list[dict]:
    texts = json.loads(SNIPPETS.read_text()) if SNIPPETS.exists() else ["def parse_args(argv=None):\n"]
    prompts = [model.tokenizer.encode(t)[:200] for t in texts]
    base = GenerationConfig(max_tokens=a.max_tokens, stop_at_eos=False, temperature=0.0, dry_multiplier=0.0)  # greedy
    variants = [("none", base.replace(draft="none")), ("auto", base.replace(draft="auto"))]
    for k in (1, 2, 3):
        variants.append((f"mtp k={k}", base.replace(draft="mtp", fixed_t=k + 1, max_draft=k)))
    variants.append(("mtp (controller)", base.replace(draft="mtp")))
    variants.append(("mtp+suffix", base.replace(draft="mtp+suffix")))
    run(model, prompts[0][:20], base.replace(max_tokens=8))  # warm-up
    # per prompt, every variant in turn (a slow spell of the machine hits all variants alike)
    acc = {name: {"gen": 0.0, "dec_s": 0.0, "windows": 0, "drafted": 0, "accepted": 0, "offered": [0, 0, 0],
                  "kept": [0, 0, 0], "same": True} for name, _ in variants}
    for ids in prompts:
        ref = None
        for name, cfg in variants:
            outs = [run(model, ids, cfg) for _ in range(a.repeat)]
            out, d = sorted(outs, key=lambda od: od[1]["decode_s"])[len(outs) // 2]
            if name == "none":
                ref = out
            A = acc[name]
            A["same"] &= out == ref
            A["gen"] += d["generated_tokens"]
            A["dec_s"] += d["decode_s"]
            A["windows"] += d["windows"]
            A["drafted"] += d["drafted"]
            A["accepted"] += d["accepted"]
            dd = d.get("draft", {})
            for i, o in enumerate(dd.get("mtp_offered_by_depth", [])[:3]):
                A["offered"][i] += o
                ad = dd.get("mtp_acceptance_by_depth", [None] * 3)[i]
                A["kept"][i] += round(ad * o) if ad is not None else 0
    rows = []
    for name, _ in variants:
        A = acc[name]
        rows.append({"variant": name, "tok_s": A["gen"] / A["dec_s"], "tokens_per_window": A["gen"] / A["windows"],
                     "acceptance": A["accepted"] / A["drafted"] if A["drafted"] else 0.0,
                     "acceptance_by_depth": [k / o if o else None for k, o in zip(A["kept"], A["offered"])],
                     "identical": A["same"]})
    plain = rows[0]["tok_s"]
    for r in rows:
        r["speedup"] = r["tok_s"] / plain
    return rows


def cost_part(path, threads, reps=20) -> dict:
    m = Model.load(path, threads=threads)
    if not m.has_mtp:
        raise SystemExit(f"{path} has no MTP block (synth ... --mtp)")
    s = m.session(n_ctx=512, mtp=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, m.n_vocab, 64).tolist()
    s.run(prompt[:-1], last_only=True)
    s.commit(63)
    s.mtp_draft(prompt[-1], 1)  # consume the prompt backlog
    cp = s.checkpoint()
    p = sampling_params(GenerationConfig(temperature=0.0))  # greedy
    res = {"model": str(path), "threads": m.threads, "draft_ms": {}, "verify_ms": {}}
    # fresh random tokens every repetition: the rows then route to other experts each time, as in decoding
    # (repeating one window would time it with its experts' weights already in cache)
    for T in (1, 2, 3, 4):
        ts = []
        for _ in range(reps):
            s.restore(cp)
            toks = rng.integers(0, m.n_vocab, T).astype(np.int32)
            t0 = time.perf_counter()
            s._core.run_sample(toks, p)
            ts.append(time.perf_counter() - t0)
            s._core.commit(1)
        res["verify_ms"][T] = statistics.median(ts) * 1e3
    for k in (1, 2, 3):
        ts = []
        for _ in range(reps):
            s.restore(cp)
            s.run([int(rng.integers(0, m.n_vocab))])
            s.commit(1)
            t0 = time.perf_counter()
            s.mtp_draft(int(rng.integers(0, m.n_vocab)), k)
            ts.append(time.perf_counter() - t0)
        res["draft_ms"][k] = statistics.median(ts) * 1e3
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m")
    ap.add_argument("--threads", "-t", type=int, default=None)
    ap.add_argument("--max-tokens", "-n", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cost-model", help="a GGUF with an MTP block for the cost split (part 2)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    out = {"date": time.strftime("%Y-%m-%d %H:%M")}
    if a.cost_model:
        c = cost_part(a.cost_model, a.threads)
        out["cost"] = c
        print(f"{Path(c['model']).name}: plain step {c['verify_ms'][1]:.2f} ms")
        for T in (2, 3, 4):
            print(f"  verify T={T}: {c['verify_ms'][T]:.2f} ms ({c['verify_ms'][T] / c['verify_ms'][1]:.2f}x)")
        for k in (1, 2, 3):
            print(f"  mtp_draft k={k}: {c['draft_ms'][k]:.2f} ms ({c['draft_ms'][k] / c['verify_ms'][1]:.2f}x a step)")
    else:
        model = Model.load(a.model or default_model_path(), threads=a.threads)
        rows = acceptance_part(model, a)
        out["model"] = str(model.path)
        out["rows"] = rows
        print(f"{model.path.name}, {model.threads} threads, greedy, {a.max_tokens} tokens per held-out snippet")
        print(f"{'variant':<18} {'tok/s':>8} {'speedup':>8} {'tok/win':>8} {'accept':>7}  by depth       same")
        for r in rows:
            depth = " ".join("-" if x is None else f"{x:.2f}" for x in r["acceptance_by_depth"])
            print(f"{r['variant']:<18} {r['tok_s']:>8.1f} {r['speedup']:>7.2f}x {r['tokens_per_window']:>8.2f} "
                  f"{r['acceptance']:>7.2f}  {depth:<14} {'yes' if r['identical'] else 'NO'}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
