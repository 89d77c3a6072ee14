"""Choosing the default sampling settings by measurement (issue 20): repetition, self-likelihood and speed on
held-out prompts of the default model, and instruction following on held-out requests.

    python bench/bench_defaults.py [--model M.gguf] [--threads 2] [--max-tokens 120] [--json OUT.json]
                                   [--requests 50] [--settings greedy,default,...]

Data (tools/default_model_chat/, mined on the device by tools/finetune_chat.py from the held-out packages of
docs/MODEL.md, never trained on): heldout_prompts.json, 20 completion prompts (a def line cut after its "(",
as in the README's command) with the true function as reference; heldout_requests.json, requests made from
docstrings (as the fine-tune's pairs are).

Per setting, over the 20 prompts (seeds 1..20, one per prompt):
  loops       outputs with a non-blank line longer than 8 characters 3 times in a row (the target: none)
  rep lines   share of non-blank lines (> 8 characters) equal to an earlier line of the same output
  rep 4-grams share of token 4-grams already seen in the same output; `ref` is the held-out code's own rate
              (the reference functions, cut to the same number of tokens as each output)
  nll         mean negative log-likelihood (nats/token) of the emitted tokens under the model's raw
              distribution (low = predictable; greedy loops score lowest, so read it beside the repetition)
  tok/s       decode tokens/s with --draft auto and with --draft none (alternated per prompt; same outputs)
With --requests N: the share of chat answers (default template, the setting's sampling) holding a function that
parses and whose name or body mentions the request's subject (a content word of the request).
Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

from strata_py.config import GenerationConfig
from strata_py.generate import chat_prompt, generate_ids, make_proposer
from strata_py.model import Model
from strata_py.speculative import LoopStats

from machine import write_json

DATA = Path(__file__).resolve().parent.parent / "tools" / "default_model_chat"
CODE_BREAKERS = ['"']  # breakers for code: quotes only (newline and colon would reset DRY at every line)

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "greedy+dry0.8": dict(temperature=0.0, dry_multiplier=0.8),
    "greedy+dry0.8/code": dict(temperature=0.0, dry_multiplier=0.8, dry_sequence_breakers=CODE_BREAKERS),
    "t0.7/p0.9": dict(temperature=0.7, top_p=0.9),
    "t0.7/minp0.05": dict(temperature=0.7, min_p=0.05),
    "t0.7/minp0.05+dry0.8": dict(temperature=0.7, min_p=0.05, dry_multiplier=0.8),
    "t0.7/minp0.05+dry0.8/code": dict(temperature=0.7, min_p=0.05, dry_multiplier=0.8,
                                      dry_sequence_breakers=CODE_BREAKERS),
    "t0.7/minp0.05+dry0.4/code": dict(temperature=0.7, min_p=0.05, dry_multiplier=0.4,
                                      dry_sequence_breakers=CODE_BREAKERS),
    "t1.0/minp0.1+dry0.8/code": dict(temperature=1.0, min_p=0.1, dry_multiplier=0.8,
                                     dry_sequence_breakers=CODE_BREAKERS),
    "default": {},
}

STOP = set("""a an the of to in on for and or with from into by is are be as at this that these those it its
their there when then than else which what who whose given write python function class implement wanted
return returns returned value values object objects based using used use each every list new""".split())


def long_lines(text: str) -> list[str]:
    return [ln for ln in text.split("\n") if len(ln.strip()) > 8]


def has_loop(text: str) -> bool:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return any(len(lines[i].strip()) > 8 and lines[i] == lines[i + 1] == lines[i + 2] for i in range(len(lines) - 2))


def repeated_lines(text: str) -> tuple[int, int]:
    seen, rep = set(), 0
    ls = long_lines(text)
    for ln in ls:
        rep += ln in seen
        seen.add(ln)
    return rep, len(ls)


def repeated_4grams(ids: list[int]) -> tuple[int, int]:
    seen, rep = set(), 0
    grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
    for g in grams:
        rep += g in seen
        seen.add(g)
    return rep, len(grams)


def self_nll(model: Model, prompt: list[int], out: list[int]) -> float:
    """Mean NLL of `out` after `prompt` under the raw distribution (windows of up to 16 rows)."""
    if not out:
        return float("nan")
    s = model.session(n_ctx=len(prompt) + len(out) + 8, max_window=16)
    seq = prompt + out
    p = len(prompt)
    if p > 1:
        s.run(seq[:p - 1])
        s.commit(p - 1)
    tot, i = 0.0, p - 1
    while i < len(seq) - 1:
        T = min(16, len(seq) - 1 - i)
        s.run(seq[i:i + T])
        lp = s.logprobs(seq[i + 1:i + 1 + T])[0]
        s.commit(T)
        tot -= float(np.sum(lp))
        i += T
    return tot / len(out)


def run_one(model, ids, cfg, draft):
    st = LoopStats()
    prop = make_proposer(model, cfg.replace(draft=draft))
    out = list(generate_ids(model, ids, cfg.replace(draft=draft), stats=st, proposer=prop))
    eog = set(model.tokenizer.eog_ids)
    if out and out[-1] in eog:
        out = out[:-1]
    return out, st


def subject_words(request: str) -> set[str]:
    words = re.findall(r"[A-Za-z][A-Za-z_]+", request)
    return {w.lower() for w in words if len(w) >= 4 and w.lower() not in STOP}


def function_ok(answer: str, request: str) -> tuple[bool, bool]:
    """(a function parses, and its name or body mentions a subject word): the longest prefix of the answer's
    lines that parses and defines a function (answers cut by the token limit lose their unfinished tail)."""
    lines = answer.split("\n")
    for n in range(len(lines), 0, -1):
        src = "\n".join(lines[:n])
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        fns = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not fns:
            continue
        body = src.lower()
        subj = subject_words(request)
        named = any(any(w[:5] in f.name.lower() for w in subj) for f in fns)
        return True, named or any(w in body for w in subj)
    return False, False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--requests", type=int, default=0, help="chat requests to score per setting (0 = none)")
    ap.add_argument("--request-settings", default="greedy,default", help="settings for the chat requests")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    model = Model.load(a.model, threads=a.threads)
    tok = model.tokenizer
    prompts = json.load(open(DATA / "heldout_prompts.json"))
    requests = json.load(open(DATA / "heldout_requests.json"))[: a.requests]
    res = {"model": str(model.path.name), "threads": a.threads, "max_tokens": a.max_tokens, "machine": {
        "cpu": platform.processor() or platform.machine(), "load_avg": os.getloadavg(), "date": time.ctime()},
        "defaults": {k: getattr(GenerationConfig(), k) for k in ("temperature", "top_p", "min_p", "dry_multiplier",
                                                               "dry_sequence_breakers", "draft")},
        "settings": {}}
    ref_rep = [0, 0]
    for i, pr in enumerate(prompts):
        ids = tok.encode(pr["prompt"])
        ref_ids = tok.encode(pr["reference"])[len(ids):]
        r = repeated_4grams(ref_ids[: a.max_tokens])
        ref_rep[0] += r[0]
        ref_rep[1] += r[1]
    res["reference_rep4"] = ref_rep[0] / max(1, ref_rep[1])
    for name in a.settings.split(","):
        opts = SETTINGS[name]
        row = {"loops": 0, "rep_lines": [0, 0], "rep4": [0, 0], "ref4": [0, 0], "nll": [], "tok": {"auto": 0, "none": 0},
               "time": {"auto": 0.0, "none": 0.0}, "same_output": True, "samples": []}
        for i, pr in enumerate(prompts):
            cfg = GenerationConfig(max_tokens=a.max_tokens, seed=i + 1, **opts)
            ids = tok.encode(pr["prompt"])
            outs = {}
            for draft in (("auto", "none") if i % 2 == 0 else ("none", "auto")):
                out, st = run_one(model, ids, cfg, draft)
                outs[draft] = out
                row["tok"][draft] += st.generated
                row["time"][draft] += st.decode_s
            out = outs["auto"]
            row["same_output"] &= outs["auto"] == outs["none"]
            text = tok.decode(out)
            row["loops"] += has_loop(text)
            for k, v in (("rep_lines", repeated_lines(text)), ("rep4", repeated_4grams(out)),
                         ("ref4", repeated_4grams(tok.encode(pr["reference"])[len(ids):][: len(out)]))):
                row[k][0] += v[0]
                row[k][1] += v[1]
            row["nll"].append(self_nll(model, ids, out))
            if i < 2:
                row["samples"].append(pr["prompt"] + text)
        out_row = {"loops": row["loops"], "prompts": len(prompts),
                   "rep_lines": row["rep_lines"][0] / max(1, row["rep_lines"][1]),
                   "rep4": row["rep4"][0] / max(1, row["rep4"][1]), "ref4": row["ref4"][0] / max(1, row["ref4"][1]),
                   "nll": float(np.nanmean(row["nll"])),
                   "tok_s_auto": row["tok"]["auto"] / max(1e-9, row["time"]["auto"]),
                   "tok_s_none": row["tok"]["none"] / max(1e-9, row["time"]["none"]),
                   "same_output": row["same_output"], "options": opts, "samples": row["samples"]}
        out_row["speedup"] = out_row["tok_s_auto"] / max(1e-9, out_row["tok_s_none"])
        res["settings"][name] = out_row
        print(f"{name:28s} loops {out_row['loops']:2d}/{len(prompts)}  rep-lines {out_row['rep_lines']:.3f}  "
              f"rep4 {out_row['rep4']:.3f} (ref {out_row['ref4']:.3f})  nll {out_row['nll']:.3f}  "
              f"tok/s auto {out_row['tok_s_auto']:.0f} none {out_row['tok_s_none']:.0f} "
              f"(x{out_row['speedup']:.2f}) same={out_row['same_output']}", flush=True)
    if requests:
        res["requests"] = {}
        for name in a.request_settings.split(","):
            ok = named = 0
            samples = []
            for j, rq in enumerate(requests):
                cfg = GenerationConfig(max_tokens=256, seed=j + 1, **SETTINGS[name])
                text, cfg = chat_prompt(model, rq["request"], cfg)
                ids = tok.encode(text)
                out, _ = run_one(model, ids, cfg, "auto")
                ans = tok.decode(out).split("<|im_end|>")[0]
                p, m = function_ok(ans, rq["request"])
                ok += p
                named += p and m
                if j < 3:
                    samples.append({"request": rq["request"], "answer": ans})
            res["requests"][name] = {"n": len(requests), "parses": ok / len(requests),
                                     "parses_and_on_subject": named / len(requests), "samples": samples}
            print(f"requests {name:20s} parses {ok}/{len(requests)}  parses+on-subject {named}/{len(requests)}",
                  flush=True)
    write_json(a.json, res)
    print(f"held-out code's own rep4 (the prompts' reference functions, {a.max_tokens} tokens): "
          f"{res['reference_rep4']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
