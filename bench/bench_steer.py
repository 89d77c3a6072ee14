"""Steering benchmark (issue 15): what each logit processor costs per token, and whether speculation still pays
under a JSON schema.

    python bench/bench_steer.py [--model M.gguf] [--threads N] [--rounds 5] [--json OUT.json]

1. Per-token overhead, components (the same window's logits, finished again and again; rounds alternate
   plain and steered): for T = 1 and 16-row windows, the steered finish (Session.sample) minus the plain one,
   plus the Python side per window (the grammar's masks + rollback, or the lazy checks with their re-finishes;
   the phrase state's step is in commit), per row, against a plain decode step (T = 1 run + finish) measured
   in the same rounds. Processors: logit bias (8 ids), 100 phrases, 10 000 phrases, a JSON schema (full masks,
   and lazy), greedy; then the JSON schema under sampled decoding (SAMPLED), full masks and lazy.
2. End to end: plain decode (T = 1) tok/s with each processor, rounds alternating, median (greedy); and
   sampled decoding on the JSON prompt: no schema, schema lazy, schema full masks.
3. Suffix drafting vs plain, both under a JSON schema, on a repetitive JSON workload (a list of records);
   the outputs must be identical. Also the grammar masks computed during the forward ("overlap") vs before.
4. Constrained vs plain end to end, greedy and sampled, T = 1 and suffix drafting: the schema (lazy masks, the
   default) against no schema on the same prompt, rounds alternating; tok/s, process and main-thread CPU time per token (for a
   machine others use) and the pool workers' sleeps per token.
5. Where a constrained T = 1 step's time goes: the same loop by hand, timed in three parts (forward + finish,
   the grammar's step, commit), against plain decoding of the same tokens, and of the same tokens with a 40 us
   idle spin in Python in place of the grammar's step (a step that touches no memory), each with the pool's
   linger on (speculative.GRAMMAR_LINGER_US, the default) and off; then every llguidance call of the step timed
   (calls per token, us per call).
Targets: 10 000 phrases <= 3 % of a plain decode step; JSON schema <= 10 %; suffix under the schema >= 1.5x.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from strata_py import speculative
from strata_py.config import GenerationConfig
from strata_py.generate import generate_ids, make_proposer
from strata_py.speculative import LoopStats

SCHEMA = {"type": "array", "minItems": 20, "maxItems": 24, "items": {
    "type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "maxLength": 16},
        "kind": {"enum": ["int", "str", "bool", "float"]},
        "required": {"type": "boolean"}},
    "required": ["id", "name", "kind", "required"], "additionalProperties": False}}

RECORDS = ", ".join(json.dumps({"id": i, "name": f"field_{i}", "kind": k, "required": i % 2 == 0})
                    for i, k in zip(range(6), ["int", "str", "bool", "float", "int", "str"]))
JSON_PROMPT = f"FIELDS = [{RECORDS}]\n\nCOLUMNS = "


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def synthetic_phrases(tok, n, seed=0):
    """n distinct phrases of 1-4 vocabulary words (lower-case alphabetic tokens with a leading space)."""
    words = [tok.token_bytes(i).decode("utf-8", "replace").strip() for i in range(tok.n_vocab)]
    words = sorted({w for i, w in enumerate(words)
                    if tok.token_bytes(i).startswith(b" ") and w.isalpha() and w.islower() and len(w) > 2})
    rng = np.random.default_rng(seed)
    out = set()
    while len(out) < n:
        k = int(rng.integers(1, 5))
        out.add(" ".join(rng.choice(words, k)))
    return [(p, 4.0 if i % 10 else float("inf")) for i, p in enumerate(sorted(out))]


def steer_configs(model):
    tok = model.tokenizer
    bias = {int(t): -1.5 for t in np.random.default_rng(1).integers(0, model.n_vocab, 8)}
    from strata_py.steering import default_phrases
    p100 = default_phrases()[:100]
    return {"bias": dict(logit_bias=bias), "phrases100": dict(ban_phrases=p100),
            "phrases10k": dict(ban_phrases=synthetic_phrases(tok, 10_000)), "json": dict(json_schema=SCHEMA)}


# sampled decoding: the defaults' sampler (temperature 0.7, min-p 0.05; DRY off, as in every component here)
SAMPLED = dict(temperature=0.7, min_p=0.05, top_k=0, top_p=1.0, seed=7, dry_multiplier=0.0)


def components(model, configs, rounds, reps, sampled=False):
    """Per-row cost of each processor at T = 1 and T = 16 (see the module docstring, part 1). sampled: the JSON
    schema only, under the sampled decoding of SAMPLED (full masks, and lazy: traced finish + fix_rows), along
    the sampled output (so a window's rows are kept, as in decoding), against a plain sampled step."""
    from strata_py.model import sampling_params
    from strata_py.steering import Steering

    tok = model.tokenizer
    # the rows: a real JSON continuation (valid under SCHEMA, so the grammar walks every row)
    base = GenerationConfig(max_tokens=200, json_schema=SCHEMA, draft="none", temperature=0.0, dry_multiplier=0.0)
    if sampled:
        base = base.replace(**SAMPLED)
        configs = {"json_sampled": dict(json_schema=SCHEMA)}
    prompt = tok.encode(JSON_PROMPT)
    out = list(generate_ids(model, prompt, base))
    params = sampling_params(base)
    cap = speculative.LAZY_CAP
    res = {}
    for T in (1, 16):
        s = model.session(n_ctx=1024, max_window=16)
        s.run(prompt[:-1])
        s.commit(len(prompt) - 1)
        # a window in the middle of the output: committed = prompt + out[:40], inputs = out[40 : 40 + T]
        ctx = [prompt[-1]] + out[:40]
        s.run(ctx)
        s.commit(len(ctx))
        cp = s.checkpoint()
        pos0 = s.position
        inputs = out[40:40 + T]
        steers = {}
        for name, kw in configs.items():
            steers[name] = Steering(model, base.replace(**{"json_schema": None, **kw}), 16)
        # a plain decode step (T = 1 run + finish + commit, continuing the text), the reference for the percentages:
        # each step timed alone; the median, and the 10th percentile (on a loaded machine, the closest to a quiet step)
        steps = []
        for _ in range(rounds):
            s.restore(cp)
            for j in range(reps // 2):
                t0 = time.perf_counter()
                s._core.run_sample(np.asarray(out[40 + j:41 + j], dtype=np.int32), params, None)
                s._core.commit(1)
                steps.append(time.perf_counter() - t0)
        steps.sort()
        step_s, step_p10 = steps[len(steps) // 2], steps[len(steps) // 10]
        grammar = "json_sampled" if sampled else "json"
        lazy_name = grammar + "_lazy"
        names = [*configs, lazy_name]
        steers[lazy_name] = steers[grammar]
        fin = {name: [] for name in ["plain", *names]}
        py = {name: [] for name in names}
        for _ in range(rounds):
            for name in fin:  # alternate within the round
                st = steers.get(name)
                s.restore(cp)
                s._core.set_steering(st.core if st else None, len(prompt))
                g = st.grammar if st else None
                if g:
                    g.sync(s.tokens, len(prompt))
                s.run(inputs)
                lazy = name == lazy_name  # unconstrained traced finish, then fix_rows checks the rows
                masks = g.window_masks(inputs, pos0) if g and not lazy else None
                if g:  # back to the committed state, as commit(keep) would after the window
                    g.matcher.rollback(g._window)
                    g._window = 0
                t0 = time.perf_counter()
                for _ in range(reps):
                    if lazy:
                        s._core.sample_traced(params, cap)
                    else:
                        s._core.sample(params, masks)
                fin[name].append((time.perf_counter() - t0) / reps)
                if st is not None and g is None:  # the C++ processors' Python side: nothing per window
                    py[name].append(0.0)
                s.commit(1)
        plain_fin = _median(fin["plain"])
        for name, lazy in ((grammar, False), (lazy_name, True)):  # the grammar's work over new states
            py[name] = grammar_walk(model, base, prompt, out, T, lazy, params)
        for name in names:
            extra = (_median(fin[name]) - plain_fin) + _median(py[name])
            res[f"{name}/T={T}"] = {"processor": name, "T": T, "finish_us": _median(fin[name]) * 1e6,
                                    "plain_finish_us": plain_fin * 1e6, "python_us": _median(py[name]) * 1e6,
                                    "overhead_us_per_row": extra / T * 1e6, "plain_step_us": step_s * 1e6,
                                    "plain_step_p10_us": step_p10 * 1e6,
                                    "overhead_pct_of_step": 100 * extra / T / step_s,
                                    "overhead_pct_of_step_p10": 100 * extra / T / step_p10}
    return res


def grammar_walk(model, cfg, prompt, out, T, lazy, params, start=40):
    """The grammar's Python work per window (masks or lazy checks and their re-finishes, then commit), over real
    and new states: consecutive windows of T rows along the output (a state's mask is never asked for twice)."""
    from strata_py.steering import Steering

    s = model.session(n_ctx=1024, max_window=16)
    s.run(prompt[:-1])
    s.commit(len(prompt) - 1)
    ctx = [prompt[-1]] + out[:start]
    s.run(ctx)
    s.commit(len(ctx))
    st = Steering(model, cfg, 16)
    st.attach(s, len(prompt))
    g, core = st.grammar, s._core
    times = []
    pos = start
    while pos + T < len(out):
        inputs = out[pos:pos + T]
        pos0 = s.position
        # the forward and the unmasked (traced) finish: not timed
        free, cands, complete = core.run_sample_traced(np.asarray(inputs, dtype=np.int32), params,
                                                       speculative.LAZY_CAP)
        t0 = time.perf_counter()
        if lazy:
            g.fix_rows(inputs, pos0, free, cands, complete, lambda i, mk: core.sample_row(params, i, mk), core.repick)
        else:
            g.window_masks(inputs, pos0)
        g.commit(T)
        times.append(time.perf_counter() - t0)
        core.commit(T)
        pos += T
    if lazy:
        print(f"  lazy walk T={T} ({'sampled' if params.temperature > 0 else 'greedy'}): {g.checked} rows, "
              f"{g.validated} candidates validated, {g.repicked} repicked, {g.full} full masks + re-finish")
    return times


def end_to_end(model, configs, rounds, n):
    prompt = model.tokenizer.encode("import os\n")
    runs = {name: [] for name in ["plain", *configs, "plain_json_prompt"]}
    outs = {}
    for _ in range(rounds):
        for name in runs:
            kw = configs.get(name, {})
            p = model.tokenizer.encode(JSON_PROMPT) if name in ("json", "plain_json_prompt") else prompt
            cfg = GenerationConfig(max_tokens=n, draft="none", stop_at_eos=False, temperature=0.0, dry_multiplier=0.0, **kw)
            st = LoopStats()
            outs[name] = list(generate_ids(model, p, cfg, stats=st))
            runs[name].append(st.as_dict()["decode_tok_s"])
    return {name: {"tok_s": _median(v), "tok_s_runs": v, "tokens": len(outs[name])} for name, v in runs.items()}


def sampled_json(model, rounds, n):
    """End to end, sampled (SAMPLED), plain decode (T = 1) on the JSON prompt: no schema, the schema with lazy
    masks (the default), the schema with full masks; rounds alternate. The two schema runs must be identical."""
    ids = model.tokenizer.encode(JSON_PROMPT)
    runs = {"plain": [], "json_lazy": [], "json_full": []}
    outs = {}
    for _ in range(rounds):
        for name in runs:
            speculative.LAZY_MASKS = name != "json_full"
            cfg = GenerationConfig(max_tokens=n, draft="none", stop_at_eos=False, **SAMPLED,
                                   json_schema=None if name == "plain" else SCHEMA)
            st = LoopStats()
            outs[name] = list(generate_ids(model, ids, cfg, stats=st))
            runs[name].append(st.as_dict()["decode_tok_s"])
    speculative.LAZY_MASKS = True
    res = {name: {"tok_s": _median(v), "tok_s_runs": v, "tokens": len(outs[name])} for name, v in runs.items()}
    return res, outs["json_lazy"] == outs["json_full"]


def suffix_under_schema(model, rounds, n):
    ids = model.tokenizer.encode(JSON_PROMPT)
    res = {}
    outs = {}
    for overlap, lazy in ((False, False), (True, False), (False, True)):
        speculative.overlap_masks = (lambda m, o=overlap: o)
        speculative.LAZY_MASKS = lazy
        runs = {"none": [], "suffix": []}
        for _ in range(rounds):
            for draft in runs:
                cfg = GenerationConfig(max_tokens=n, json_schema=SCHEMA, draft=draft, temperature=0.0, dry_multiplier=0.0)
                st = LoopStats()
                prop = make_proposer(model, cfg)
                outs[(overlap, lazy, draft)] = list(generate_ids(model, ids, cfg, stats=st, proposer=prop))
                runs[draft].append(st.as_dict())
        for draft, v in runs.items():
            res[f"{draft}/overlap={overlap}/lazy={lazy}"] = {
                "draft": draft, "overlap": overlap, "lazy": lazy, "tok_s": _median([d["decode_tok_s"] for d in v]),
                "tok_s_runs": [d["decode_tok_s"] for d in v], "tokens": v[-1]["generated_tokens"],
                "acceptance": v[-1]["acceptance"], "e_keep": v[-1]["e_keep"], "stop": v[-1]["stop"]}
    speculative.LAZY_MASKS = True
    plain = outs[(False, False, "none")]
    identical = all(o == plain for o in outs.values())
    return res, identical, model.tokenizer.decode(plain, skip_special=True)


class _Recorded:
    """A drafter whose drafts are recorded (the windows a run verified, for replaying them without a grammar)."""

    def __init__(self, inner):
        self.inner, self.drafts = inner, {}  # context length (the window's position) -> its drafts

    def propose(self, context, max_drafts):
        d = list(self.inner.propose(context, max_drafts))[:max_drafts]
        self.drafts[len(context)] = d
        return d

    def observe(self, drafts, accepted):
        self.inner.observe(drafts, accepted)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def replay(model, ids, cfg, windows):
    """The windows [(inputs, keep)] of a run, verified again without steering (an unmasked finish, as plain
    decoding's): the same forwards and commits as the run, none of its grammar work. Returns tok/s."""
    from strata_py.model import sampling_params
    from strata_py.speculative import prefill

    s = model.session(n_ctx=max(1024, len(ids) + cfg.max_tokens + 32), max_window=cfg.max_window)
    prefill(s, ids[:-1])
    core, params = s._core, sampling_params(cfg)
    tokens = 0
    t0 = time.perf_counter()
    for inputs, keep in windows:
        core.run_sample(np.asarray(inputs, dtype=np.int32), params, None)
        core.commit(keep)
        tokens += keep
    return tokens / (time.perf_counter() - t0)


def constrained_vs_plain(model, rounds, n):
    """Part 4: {greedy, sampled} x {T = 1, suffix drafting}: no schema vs the schema (lazy masks), same prompt,
    rounds alternating; and the schema run's own windows replayed without the grammar ("same windows": the same
    forwards, so the ratio is the constraint's cost alone, whatever the output does to drafting). Per run: tok/s,
    process and main-thread CPU time per token, pool worker sleeps per token."""
    ids = model.tokenizer.encode(JSON_PROMPT)
    runs = {}
    for _ in range(rounds):
        for mode in ("greedy", "sampled"):
            for draft in ("none", "suffix"):
                for schema in (None, SCHEMA):
                    kw = dict(SAMPLED) if mode == "sampled" else dict(temperature=0.0, dry_multiplier=0.0)
                    cfg = GenerationConfig(max_tokens=n, draft=draft, stop_at_eos=False, json_schema=schema, **kw)
                    st = LoopStats()
                    prop = make_proposer(model, cfg)
                    prop = _Recorded(prop) if prop is not None else None
                    sl0, c0, m0 = model._core.pool_sleeps, time.process_time(), time.thread_time()
                    out = list(generate_ids(model, ids, cfg, stats=st, proposer=prop))
                    m1, c1, sl1 = time.thread_time(), time.process_time(), model._core.pool_sleeps
                    d = st.as_dict()
                    runs.setdefault((mode, draft, "schema" if schema else "plain"), []).append(
                        {"tok_s": d["decode_tok_s"], "cpu_us_per_token": (c1 - c0) / len(out) * 1e6,
                         "main_cpu_us_per_token": (m1 - m0) / len(out) * 1e6,
                         "sleeps_per_token": (sl1 - sl0) / len(out), "e_keep": d["e_keep"], "tokens": len(out)})
                    if schema:  # its windows: root = the last kept token, drafts as proposed, keep as emitted
                        windows, root, pos = [], ids[-1], 0
                        for keep in st.window_tokens:
                            drafts = prop.drafts.get(len(ids) + pos, []) if prop is not None else []
                            windows.append(([root] + drafts, keep))
                            pos += keep
                            root = out[pos - 1]
                        sl0, c0, m0 = model._core.pool_sleeps, time.process_time(), time.thread_time()
                        tok_s = replay(model, ids, cfg, windows)
                        m1, c1, sl1 = time.thread_time(), time.process_time(), model._core.pool_sleeps
                        runs.setdefault((mode, draft, "same windows, no grammar"), []).append(
                            {"tok_s": tok_s, "cpu_us_per_token": (c1 - c0) / len(out) * 1e6,
                             "main_cpu_us_per_token": (m1 - m0) / len(out) * 1e6,
                             "sleeps_per_token": (sl1 - sl0) / len(out), "e_keep": d["e_keep"], "tokens": len(out)})
    res = {}
    for (mode, draft, run), v in runs.items():
        res[f"{mode}/{draft}/{run}"] = {
            "mode": mode, "draft": draft, "run": run,
            **{k: _median([r[k] for r in v]) for k in ("tok_s", "cpu_us_per_token", "main_cpu_us_per_token",
                                                        "sleeps_per_token", "e_keep")},
            "tok_s_runs": [r["tok_s"] for r in v], "tokens": v[-1]["tokens"]}
    return res


def step_breakdown(model, rounds, n):
    """Part 5 (see the module docstring): per-token medians of the three parts of a T = 1 step, us."""
    from strata_py.model import sampling_params
    from strata_py.speculative import prefill
    from strata_py.steering import Steering

    ids = model.tokenizer.encode(JSON_PROMPT)
    pc = time.perf_counter
    cap, linger_default = speculative.LAZY_CAP, speculative.GRAMMAR_LINGER_US

    def session():
        s = model.session(n_ctx=1024, max_window=16)
        prefill(s, ids[:-1])
        return s

    def constrained(cfg, linger, rec, matcher=None):
        s = session()
        core, params = s._core, sampling_params(cfg)
        st = Steering(model, cfg, 16)
        st.attach(s, s.position + 1)
        g = st.grammar
        if matcher is not None:
            g.matcher = matcher(g.matcher)
        root, toks = ids[-1], []
        for _ in range(n):
            sl0, t0 = model._core.pool_sleeps, pc()
            out, cands, complete = core.run_sample_traced(np.asarray([root], dtype=np.int32), params, cap, linger)
            t1 = pc()
            out = g.fix_rows([root], s.position, out, cands, complete,
                             lambda i, mk: core.sample_row(params, i, mk), core.repick)
            t2 = pc()
            core.commit(1)
            st.commit(1)
            rec.append((t1 - t0, t2 - t1, pc() - t2, model._core.pool_sleeps - sl0))
            root = out[0]
            toks.append(root)
        return toks

    def plain(cfg, toks, linger, rec, gap_us=0.0):
        s = session()
        core, params = s._core, sampling_params(cfg)
        root = ids[-1]
        for t in toks:
            sl0, t0 = model._core.pool_sleeps, pc()
            core.run_sample(np.asarray([root], dtype=np.int32), params, None, linger)
            t1 = pc()
            end = t1 + gap_us * 1e-6
            while pc() < end:  # idle: no memory touched
                pass
            t2 = pc()
            core.commit(1)
            rec.append((t1 - t0, t2 - t1, pc() - t2, model._core.pool_sleeps - sl0))
            root = t

    res = {}
    for mode in ("greedy", "sampled"):
        cfg = GenerationConfig(max_tokens=n, json_schema=SCHEMA, draft="none", temperature=0.0, dry_multiplier=0.0)
        if mode == "sampled":
            cfg = cfg.replace(**SAMPLED)
        toks = constrained(cfg, linger_default, [])
        recs = {}
        for _ in range(rounds):
            for linger in (linger_default, 0.0):
                for name, fn in (("schema", lambda rec: constrained(cfg, linger, rec)),
                                 ("plain, same tokens", lambda rec: plain(cfg, toks, linger, rec)),
                                 ("plain + 40 us idle", lambda rec: plain(cfg, toks, linger, rec, 40.0))):
                    rec = []
                    fn(rec)
                    recs.setdefault((name, linger), []).extend(rec[4:])  # the first steps: warm-up
        for (name, linger), rec in recs.items():
            cols = list(zip(*rec))
            res[f"{mode}/{name}/linger={linger:g}"] = {
                "mode": mode, "run": name, "linger_us": linger, "forward_us": _median(cols[0]) * 1e6,
                "step_us": _median(cols[1]) * 1e6, "commit_us": _median(cols[2]) * 1e6,
                "total_us": _median([a + b + c for a, b, c, _ in rec]) * 1e6,
                "sleeps_per_token": sum(cols[3]) / len(rec)}
        # every llguidance call of the step, timed through a proxy (a separate pass: the proxy costs ~0.3 us a call)
        calls: dict = {}

        class Timed:
            def __init__(self, m):
                self._m = m

            def __getattr__(self, k):
                f = getattr(self._m, k)

                def w(*a):
                    t0 = pc()
                    r = f(*a)
                    calls.setdefault(k, []).append(pc() - t0)
                    return r
                return w

        for _ in range(rounds):
            constrained(cfg, linger_default, [], Timed)
        tokens = rounds * n
        res[f"{mode}/calls"] = {k: {"calls_per_token": len(v) / tokens, "us_per_call": _median(v) * 1e6,
                                    "us_per_token": sum(v) / tokens * 1e6} for k, v in calls.items()}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", "-m", help="GGUF (default: the shipped default model)")
    ap.add_argument("--threads", "-t", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per measurement (median)")
    ap.add_argument("--reps", type=int, default=200, help="finishes per component timing")
    ap.add_argument("--max-tokens", "-n", type=int, default=256)
    ap.add_argument("--json", metavar="OUT", help="write all results as JSON")
    ap.add_argument("--parts", default="1,2,3,4,5", help="which parts of the module docstring to run (default: all)")
    a = ap.parse_args(argv)
    parts = {int(x) for x in a.parts.split(",")}

    from strata_py.model import Model
    model = Model.load(a.model, threads=a.threads)
    configs = steer_configs(model)
    t_build = time.perf_counter()
    from strata_py.steering.phrases import automaton
    auto10k = automaton(model, configs["phrases10k"]["ban_phrases"])
    t_build = time.perf_counter() - t_build
    list(generate_ids(model, model.tokenizer.encode("warm up"), GenerationConfig(max_tokens=8)))
    load0 = os.getloadavg()
    comp, e2e, e2e_s, spec, versus, breakdown = {}, {}, {}, {}, {}, {}
    identical = identical_s = True
    sample_text = ""
    if 1 in parts:
        comp = components(model, configs, a.rounds, a.reps)
        comp.update(components(model, configs, a.rounds, a.reps, sampled=True))
    if 2 in parts:
        e2e = end_to_end(model, configs, a.rounds, a.max_tokens)
        e2e_s, identical_s = sampled_json(model, a.rounds, a.max_tokens)
    if 3 in parts:
        spec, identical, sample_text = suffix_under_schema(model, a.rounds, a.max_tokens)
    if 4 in parts:
        versus = constrained_vs_plain(model, a.rounds, a.max_tokens)
    if 5 in parts:
        breakdown = step_breakdown(model, a.rounds, a.max_tokens)
    load1 = os.getloadavg()

    from rich.console import Console
    from rich.table import Table
    con = Console(width=150)
    t = Table(title=f"bench_steer components: {model.path.name}, {model.threads} threads, median of {a.rounds}")
    for c in ("processor", "T", "finish us", "plain finish us", "python us/window", "overhead us/row",
              "plain step us (p50 / p10)", "% of step (p50 / p10)"):
        t.add_column(c, justify="left" if c == "processor" else "right")
    for r in comp.values():  # (empty tables for the parts not run)
        t.add_row(r["processor"], str(r["T"]), f"{r['finish_us']:.1f}", f"{r['plain_finish_us']:.1f}",
                  f"{r['python_us']:.1f}", f"{r['overhead_us_per_row']:.2f}",
                  f"{r['plain_step_us']:.0f} / {r['plain_step_p10_us']:.0f}",
                  f"{r['overhead_pct_of_step']:.1f} / {r['overhead_pct_of_step_p10']:.1f}")
    con.print(t)
    t = Table(title=f"end to end, plain decode (T = 1), {a.max_tokens} tokens")
    for c in ("processor", "tok/s", "vs plain"):
        t.add_column(c)
    for name, r in e2e.items():
        ref = e2e["plain_json_prompt" if name == "json" else "plain"]["tok_s"]  # the same prompt without steering
        t.add_row(name, f"{r['tok_s']:.0f}", f"{r['tok_s'] / ref:.3f}")
    con.print(t)
    t = Table(title=f"end to end, sampled ({SAMPLED}), plain decode (T = 1) on the JSON prompt, {a.max_tokens} tokens")
    for c in ("run", "tok/s", "vs plain"):
        t.add_column(c)
    for name, r in e2e_s.items():
        t.add_row(name, f"{r['tok_s']:.0f}", f"{r['tok_s'] / e2e_s['plain']['tok_s']:.3f}")
    con.print(t)
    t = Table(title="suffix drafting under the JSON schema (repetitive records)")
    for c in ("draft", "masks", "tok/s", "speedup", "accept", "E[keep]", "stop"):
        t.add_column(c)
    def base_key(r):
        return f"none/overlap={r['overlap']}/lazy={r['lazy']}"

    for r in spec.values():
        how = "lazy (checks)" if r["lazy"] else "full, during forward" if r["overlap"] else "full, before forward"
        t.add_row(r["draft"], how, f"{r['tok_s']:.0f}",
                  f"{r['tok_s'] / spec[base_key(r)]['tok_s']:.2f}x",
                  f"{r['acceptance']:.2f}", f"{r['e_keep']:.2f}", r["stop"])
    con.print(t)
    t = Table(title=f"constrained (JSON schema, lazy masks) vs plain on the JSON prompt, {a.max_tokens} tokens, median of {a.rounds}")
    for c in ("mode", "draft", "run", "tok/s", "schema / this", "CPU us/token (process / main thread)",
              "worker sleeps/token", "E[keep]"):
        t.add_column(c)
    for mode in ("greedy", "sampled") if versus else ():
        for draft in ("none", "suffix"):
            q = versus[f"{mode}/{draft}/schema"]
            for run in ("plain", "same windows, no grammar", "schema"):
                r = versus[f"{mode}/{draft}/{run}"]
                t.add_row(mode, draft, run, f"{r['tok_s']:.0f}", f"{q['tok_s'] / r['tok_s']:.3f}",
                          f"{r['cpu_us_per_token']:.0f} / {r['main_cpu_us_per_token']:.0f}", f"{r['sleeps_per_token']:.2f}",
                          f"{r['e_keep']:.2f}")
    con.print(t)
    t = Table(title=f"a T = 1 step's parts, us per token (median), {a.max_tokens} tokens x {a.rounds} rounds")
    for c in ("mode", "run", "linger us", "forward + finish", "grammar step / idle", "commit", "total",
              "worker sleeps/token"):
        t.add_column(c)
    for k, r in breakdown.items():
        if k.endswith("/calls"):
            continue
        t.add_row(r["mode"], r["run"], f"{r['linger_us']:g}", f"{r['forward_us']:.1f}", f"{r['step_us']:.1f}",
                  f"{r['commit_us']:.1f}", f"{r['total_us']:.1f}", f"{r['sleeps_per_token']:.2f}")
    con.print(t)
    t = Table(title="the grammar step's llguidance calls (timed through a proxy)")
    for c in ("mode", "call", "calls/token", "us/call (median)", "us/token"):
        t.add_column(c)
    for mode in ("greedy", "sampled") if breakdown else ():
        for k, r in sorted(breakdown[f"{mode}/calls"].items(), key=lambda kv: -kv[1]["us_per_token"]):
            t.add_row(mode, k, f"{r['calls_per_token']:.2f}", f"{r['us_per_call']:.2f}", f"{r['us_per_token']:.2f}")
    con.print(t)
    identical = identical and identical_s
    print(f"outputs identical (suffix runs; sampled lazy vs full: {identical_s}): {identical}; 10k-phrase automaton: {auto10k.n_patterns} patterns, "
          f"{auto10k.n_nodes} nodes, built in {t_build:.2f} s; load average {load0[0]:.2f} -> {load1[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": str(model.path), "threads": model.threads, "rounds": a.rounds, "reps": a.reps,
                       "max_tokens": a.max_tokens, "machine": platform.platform(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "loadavg": [load0, load1], "components": comp, "end_to_end": e2e, "sampled_json": e2e_s, "suffix_under_schema": spec,
                       "constrained_vs_plain": versus, "step_breakdown": breakdown,
                       "identical": identical, "automaton_10k": {"patterns": auto10k.n_patterns,
                                                                 "nodes": auto10k.n_nodes, "build_s": t_build},
                       "sample_output": sample_text[:400]}, f, indent=1)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
