"""Every drafter against plain decoding with the default settings (issue 20's `auto >= 1.2x plain` target), on the
held-out prompts of bench_defaults.py: tok/s per drafter, drafts proposed and accepted, and whether every output
equals plain's.

    python bench/bench_drafters.py [--model GGUF] [--threads 2] [--rounds 2] [--max-tokens 120] [--json OUT]

Drafters alternate in each prompt (forward and reversed order on alternate prompts and rounds), so load hits all
alike; seeds are the prompt index, as in bench_defaults.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_defaults import DATA, run_one  # noqa: E402

from strata_py.config import GenerationConfig  # noqa: E402
from strata_py.model import Model  # noqa: E402
from machine import write_json  # noqa: E402

DRAFTERS = ["none", "auto", "mtp", "mtp+suffix"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    model = Model.load(a.model, threads=a.threads)
    tok = model.tokenizer
    prompts = json.load(open(DATA / "heldout_prompts.json"))
    tot = {d: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0} for d in DRAFTERS}
    same = True
    load0 = os.getloadavg()
    for rnd in range(a.rounds):
        for i, pr in enumerate(prompts):
            cfg = GenerationConfig(max_tokens=a.max_tokens, seed=i + 1)  # the defaults otherwise
            ids = tok.encode(pr["prompt"])
            outs = {}
            for d in (DRAFTERS if (i + rnd) % 2 == 0 else DRAFTERS[::-1]):
                out, st = run_one(model, ids, cfg, d)
                outs[d] = out
                t = tot[d]
                t["tokens"] += st.generated
                t["seconds"] += st.decode_s
                t["drafted"] += st.drafted
                t["accepted"] += st.accepted
            same &= all(outs[d] == outs["none"] for d in DRAFTERS)
    plain = tot["none"]["tokens"] / tot["none"]["seconds"]
    res = {"model": model.path.name, "threads": a.threads, "rounds": a.rounds, "load_avg": [load0, os.getloadavg()],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "same_output": same, "drafters": {}}
    for d, t in tot.items():
        r = t["tokens"] / t["seconds"]
        res["drafters"][d] = {**t, "tok_s": r, "vs_plain": r / plain,
                              "acceptance": t["accepted"] / t["drafted"] if t["drafted"] else None}
        acc = f"{t['accepted'] / t['drafted']:.2f}" if t["drafted"] else "-"
        print(f"{d:11s} {r:7.1f} tok/s  x{r / plain:.2f}  drafted {t['drafted']:5d}  accepted {acc}")
    print(f"outputs identical to plain: {same}; load average {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    write_json(a.json, res)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
