"""Speculative decoding benchmark (issue 6): plain vs suffix-lookup drafting on three workloads, same run.

    python bench/bench_spec.py [--model M.gguf] [--threads N] [--backend cpu|cuda|cpu-backend] [--max-tokens 128]
                               [--json OUT.json] [--launches on|no-prefetch|off]

--model, --threads, --backend and the other model options are the CLI's (strata_py.cli_options): --backend cuda
runs every session on the GPU (tools/gpu_check.sh: the edit workload's suffix-drafted vs plain tok/s there, and
the free-form code workload's MTP-drafted vs plain).

Workloads:
  edit      code editing: a Python function, then "# same function with `items` renamed to `values`" and
            the renamed def line; the model should reproduce the body with one identifier changed.
  repeat    continuing a file with repetitive structure (a table of similar dataclass-like records).
  free      free-form prose completion (little to copy).
  replay    the edit prompt again with the global index holding an earlier answer (agent-loop re-issue).
For each workload and drafter (none, suffix, auto): emitted tok/s (decode only, prefill excluded),
acceptance, realised E[keep], T histogram, the windows during which the GPU ran or recorded a step cold (each new
session records its steps again: their count and time, included in tok/s), and whether the output is identical to
plain decoding.
tok/s is the median of --repeat rounds (drafters interleaved within each round).
Greedy by default; --temperature/--seed for sampled verification (output must be identical too).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from launch_modes import LAUNCH_MODES, set_launches
from strata_py.config import GenerationConfig
from strata_py.generate import generate_ids, make_proposer
from strata_py.speculative import LoopStats

EDIT = '''def total_price(items, tax_rate, discount=None):
    """Sum the price of every item, apply an optional discount, then add tax."""
    subtotal = 0.0
    for item in items:
        if item.quantity <= 0:
            continue
        subtotal += item.price * item.quantity
    if discount is not None:
        subtotal = max(0.0, subtotal - discount.amount_for(items))
    tax = subtotal * tax_rate
    return round(subtotal + tax, 2)


# same function with `items` renamed to `values`
def total_price(values, tax_rate, discount=None):
'''

REPEAT = "".join(
    f'''    Field(name="{n}", kind="{k}", required={r}, default={d!r}, help="The {n.replace('_', ' ')} of the record."),
''' for n, k, r, d in [("user_id", "int", True, None), ("user_name", "str", True, None),
                       ("email", "str", False, ""), ("created_at", "datetime", True, None),
                       ("updated_at", "datetime", False, None), ("is_active", "bool", False, True),
                       ("login_count", "int", False, 0)]
)
REPEAT = "SCHEMA = [\n" + REPEAT + '    Field(name="last_login", kind="datetime", required=False, default=None,'

FREE = ("The lighthouse keeper had not seen a ship in eleven days when the storm finally broke. "
        "She climbed the spiral stairs with a lantern in one hand and a letter in the other, and")

WORKLOADS = {"edit": EDIT, "repeat": REPEAT, "free": FREE, "replay": EDIT}
# replay: the edit prompt again, with the global index (earlier requests' outputs) holding one earlier
# answer to it, as in an agent loop that re-issues a request: real acceptance even on a random model,
# so the speedup there measures verification cost C(T) against E[keep].
REPLAY_EXTRA = {"global_index_tokens": 1 << 16}


def run_one(model, ids, cfg: GenerationConfig):
    proposer = make_proposer(model, cfg)
    st = LoopStats()
    out = list(generate_ids(model, ids, cfg, stats=st, proposer=proposer))
    d = st.as_dict()
    if proposer is not None and hasattr(proposer, "stats"):
        d.update(proposer.stats())
    return out, d


def main(argv=None) -> int:
    from strata_py.cli_options import add_model_args, load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)  # --model (default: the shipped default model), --threads, --backend, ...
    ap.add_argument("--max-tokens", "-n", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--dry-multiplier", type=float, default=0.0, help="DRY strength (0 = off, as this bench ran before issue 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="rounds per workload (median tok/s)")
    ap.add_argument("--max-draft", type=int, default=GenerationConfig().max_draft)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of edit,repeat,free,replay")
    ap.add_argument("--drafts", default=None,
                    help="comma-separated drafters to compare with 'none' (default: suffix,auto, plus mtp,mtp+suffix "
                         "when the model has an MTP block)")
    ap.add_argument("--json", metavar="OUT", help="write all results as JSON")
    ap.add_argument("--launches", default="on", choices=LAUNCH_MODES,
                    help="--backend cuda: kernel launches with programmatic dependent launch and the dense weight "
                         "prefetch (on, the default), without the prefetch, or plain (off); for A/B runs")
    a = ap.parse_args(argv)
    if a.launches != "on":
        if a.backend != "cuda":
            ap.error(f"bad option --launches {a.launches}: only with --backend cuda")
        set_launches(a.launches)

    from strata_py.model import default_model_path
    if a.model is None and not default_model_path().exists():
        print(f"error: the default model {default_model_path()} is not installed; pass --model", file=sys.stderr)
        return 2
    model = load_model(a)
    drafts = ["none"] + (a.drafts.split(",") if a.drafts else
                         ["suffix", "auto"] + (["mtp", "mtp+suffix"] if model.has_mtp else []))
    base = GenerationConfig(max_tokens=a.max_tokens, temperature=a.temperature, seed=a.seed, stop_at_eos=False,
                            dry_multiplier=a.dry_multiplier,
                            max_draft=a.max_draft)
    # warm-up (page in weights, first-touch buffers) so the first measured run is not penalised
    list(generate_ids(model, model.tokenizer.encode("warm up"), base.replace(max_tokens=8)))

    results = []
    for w in a.workloads.split(","):
        ids = model.tokenizer.encode(WORKLOADS[w])
        # --repeat rounds, drafters interleaved within a round so machine noise hits all alike; the
        # reported tok/s is the median round, the other figures are from the last round (deterministic)
        runs = {draft: [] for draft in drafts}
        cfg = base.replace(extra=REPLAY_EXTRA) if w == "replay" else base
        if w == "replay":
            from strata_py.drafting import suffix
            suffix._GLOBAL.clear()
            run_one(model, ids, cfg.replace(draft="suffix"))  # the earlier request: seeds the global index
        for _ in range(a.repeat):
            for draft in drafts:
                runs[draft].append(run_one(model, ids, cfg.replace(draft=draft)))
        med = {k: sorted(d["decode_tok_s"] for _, d in v)[len(v) // 2] for k, v in runs.items()}
        plain = runs["none"][-1]
        for draft in drafts:
            out, d = runs[draft][-1]
            r = {"workload": w, "draft": draft, "prompt_tokens": len(ids), "generated": d["generated_tokens"],
                 "decode_tok_s": med[draft], "speedup": med[draft] / med["none"],
                 "tok_s_runs": [d2["decode_tok_s"] for _, d2 in runs[draft]],
                 "acceptance": d["acceptance"], "e_keep": d["e_keep"], "t_hist": d["t_hist"],
                 "window_ms_mean": d["window_ms_mean"], "window_ms_p50": d["window_ms_p50"],
                 "window_ms_p99": d["window_ms_p99"], "cold_windows": d["cold_windows"], "cold_ms": d["cold_ms"],
                 "identical": all(o == plain[0] for o, _ in runs[draft])}
            for k in ("draft", "controller"):
                if k in d:
                    r[f"{k}_stats"] = d[k]
            results.append(r)

    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"bench_spec: {model.path.name}, backend {a.backend}, {model.threads} threads, {a.max_tokens} tokens, "
                    f"{'greedy' if a.temperature == 0 else f'sampled t={a.temperature} seed={a.seed}'}, "
                    f"median of {a.repeat}")
    for c in ("workload", "draft", "tok/s", "speedup", "accept", "E[keep]", "T hist", "ms p50/p99", "cold", "same"):
        t.add_column(c, justify="right" if c not in ("workload", "draft", "T hist") else "left")
    for r in results:
        t.add_row(r["workload"], r["draft"], f"{r['decode_tok_s']:.1f}", f"{r['speedup']:.2f}x",
                  f"{r['acceptance']:.2f}", f"{r['e_keep']:.2f}", " ".join(f"{k}:{v}" for k, v in r["t_hist"].items()),
                  f"{r['window_ms_p50']:.1f}/{r['window_ms_p99']:.1f}", f"{r['cold_windows']} ({r['cold_ms']:.1f} ms)",
                  "yes" if r["identical"] else "NO")
    Console(width=150).print(t)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": str(model.path), "backend": a.backend, "launches": a.launches, "threads": model.threads,
                       "max_tokens": a.max_tokens,
                       "repeat": a.repeat,
                       "temperature": a.temperature, "seed": a.seed, "machine": platform.platform(),
                       "processor": platform.processor(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "results": results}, f, indent=1)
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
