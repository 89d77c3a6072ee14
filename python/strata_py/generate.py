"""Text generation: the `generate()` API and the `python -m strata_py.generate` CLI.

    python -m strata_py.generate "def parse_args("                      # shipped default model
    python -m strata_py.generate --model M.gguf --file prompt.txt --max-tokens 200 --temperature 0.8 --seed 1
    echo "import os" | python -m strata_py.generate --stats

Text streams as it is produced (never splitting a UTF-8 character); Ctrl-C stops cleanly and keeps what
was produced. Every option is a field of GenerationConfig (config.py), shared with the server and benches.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Iterator

from .config import GenerationConfig
from .speculative import LoopStats, decode, prefill
from .steering import TextStream


def _resolve(config: GenerationConfig | None, options: dict) -> GenerationConfig:
    cfg = config or GenerationConfig()
    return cfg.replace(**options) if options else cfg.validate()


def make_proposer(model, cfg: GenerationConfig):
    """The drafter named by cfg.draft, through the registry (None for 'none')."""
    if cfg.draft == "none":
        return None
    from .drafting import create  # registry of drafters
    return create(cfg.draft, model=model, cfg=cfg)


def generate_ids(model, prompt_ids: list[int], config: GenerationConfig | None = None, *, stats: LoopStats | None = None,
                 session=None, proposer=None, n_ctx: int | None = None, **options) -> Iterator[int]:
    """Yield generated token ids for a tokenized prompt (plain or speculative decoding, same output)."""
    import time

    cfg = _resolve(config, options)
    stats = stats if stats is not None else LoopStats()
    tok = model.tokenizer
    ids = list(prompt_ids)
    if not ids:  # an empty prompt starts from the document separator
        start = tok.bos_id if tok.bos_id is not None else tok.eos_id
        if start is None:
            raise ValueError("empty prompt and the model has no BOS/EOS token to start from")
        ids = [start]
    if proposer is None:
        proposer = make_proposer(model, cfg)
    if session is None:
        need = len(ids) + cfg.max_tokens
        if n_ctx is None:
            n_ctx = min(model.n_ctx_train, max(4096, need))
        session = model.session(n_ctx=n_ctx, max_window=cfg.max_window, mtp=getattr(proposer, "needs_mtp", False))
    if len(ids) > session.n_ctx:
        raise ValueError(f"prompt of {len(ids)} tokens exceeds the context of {session.n_ctx} tokens")
    stats.prompt_tokens = len(ids)
    streaming = getattr(model, "streaming", False)
    if streaming:  # expert counters of this request: stats.experts (prefill + decode), stats.experts_decode
        from . import experts as _experts
        e0 = _experts.snapshot(model)
    t0 = time.perf_counter()
    prefill(session, ids[:-1])
    if getattr(proposer, "needs_mtp", False) and session.position > 0:
        session.mtp_prefill()  # the MTP block reads the prompt too: prefill work, not drafting
    stats.prefill_s = time.perf_counter() - t0
    if streaming:
        e1 = _experts.snapshot(model)
    if hasattr(proposer, "bind"):  # drafters that read the session (MTP)
        proposer.bind(session)
    eog = set(tok.eog_ids) if cfg.stop_at_eos else set()
    choose = getattr(proposer, "choose_drafts", None)
    try:
        yield from decode(session, ids[-1], cfg, eog, stats, proposer, choose)
    finally:
        finish = getattr(proposer, "finish", None)  # e.g. add the output to a global suffix index
        if finish is not None:
            finish()
        if streaming:
            e2 = _experts.snapshot(model)
            stats.experts = _experts.delta(e0, e2, stats.prompt_tokens + stats.generated)
            stats.experts_decode = _experts.delta(e1, e2, stats.generated)


def generate(model, prompt: str, config: GenerationConfig | None = None, *, stats: LoopStats | None = None,
             **options) -> Iterator[str]:
    """Yield text pieces continuing `prompt` (options: any GenerationConfig field, e.g. max_tokens=64).

    End-of-generation tokens end the text and are not yielded. A stop string (cfg.stop) ends it too and is
    not yielded, and no piece ever shows bytes that could still start one. Pass a LoopStats to receive the
    metrics.
    """
    cfg = _resolve(config, options)
    ids = model.tokenizer.encode(prompt)
    dec = TextStream(model.tokenizer, cfg.stop, skip_special=True)
    eog = set(model.tokenizer.eog_ids)
    for t in generate_ids(model, ids, cfg, stats=stats):
        if t in eog:
            break
        piece = dec.push(t)
        if piece:
            yield piece
        if dec.stopped:
            break
    tail = dec.flush()
    if tail:
        yield tail


def _parser() -> argparse.ArgumentParser:
    d = GenerationConfig()
    ap = argparse.ArgumentParser(prog="python -m strata_py.generate", description="Generate text with a Qwen3-Next GGUF.")
    ap.add_argument("prompt", nargs="?", help="prompt text (or --file, or standard input)")
    ap.add_argument("--model", "-m", help="GGUF file (default: the model shipped in the package)")
    ap.add_argument("--file", "-f", help="read the prompt from this file")
    ap.add_argument("--mtp", metavar="FILE", help="a separate MTP-only GGUF for --draft mtp / mtp+suffix")
    ap.add_argument("--max-tokens", "-n", type=int, default=d.max_tokens)
    ap.add_argument("--temperature", "--temp", type=float, default=d.temperature, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=d.top_k)
    ap.add_argument("--top-p", type=float, default=d.top_p)
    ap.add_argument("--min-p", type=float, default=d.min_p)
    ap.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty)
    ap.add_argument("--presence-penalty", type=float, default=d.presence_penalty)
    ap.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty)
    ap.add_argument("--penalty-last-n", type=int, default=d.penalty_last_n)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--threads", "-t", type=int, default=None, help="default: physical cores")
    ap.add_argument("--ctx", type=int, default=None, help="context size (default: prompt + max tokens, >= 4096)")
    ap.add_argument("--draft", default=d.draft, help="speculative drafter: none, suffix, auto, mtp, mtp+suffix")
    ap.add_argument("--max-draft", type=int, default=d.max_draft,
                    help="most drafts per verify window (windows of up to 1 + N rows; auto chooses fewer when they do not pay)")
    ap.add_argument("--min-match", type=int, default=d.min_match)
    ap.add_argument("--cache-mib", default=None, metavar="N|full",
                    help="stream experts from the file through a cache of N MiB (default: full = all resident)")
    ap.add_argument("--o-direct", action="store_true", help="expert reads with O_DIRECT (bypass the page cache)")
    ap.add_argument("--io-threads", type=int, default=4, help="expert reader threads (with --cache-mib)")
    ap.add_argument("--no-prefetch", action="store_true", help="do not read the next layer's predicted experts ahead")
    ap.add_argument("--prefetch-root-only", action="store_true", help="only row 0 of a window predicts experts")
    ap.add_argument("--approximate-routing", action="store_true",
                    help="APPROXIMATE cache-aware expert routing (MoCE; changes the output, needs --cache-mib)")
    ap.add_argument("--approx-protect", type=int, default=None, help="natural top-j kept (row 0)")
    ap.add_argument("--approx-bonus", type=float, default=0.85, help="resident experts' score x exp(bonus) (row 0)")
    ap.add_argument("--approx-draft-protect", type=int, default=None, help="top-j kept for draft rows")
    ap.add_argument("--approx-draft-bonus", type=float, default=None, help="bonus for draft rows")
    # steering (issue 15): exact under speculation
    ap.add_argument("--ban-phrases", action="append", default=[], metavar="FILE|default",
                    help="anti-slop phrases: one a line, optionally TAB strength (inf = ban); 'default' = the shipped "
                         "list; repeatable (the lists add up)")
    ap.add_argument("--json-schema", metavar="FILE", help="constrain the output to JSON valid under this schema")
    ap.add_argument("--regex", help="constrain the output to match this regular expression")
    ap.add_argument("--grammar", metavar="FILE", help="constrain the output to this Lark grammar (llguidance dialect)")
    ap.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable; not printed)")
    ap.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                    help="add BIAS to token ID's logit (repeatable; -inf bans the token)")
    ap.add_argument("--stats", action="store_true", help="print speed and drafting metrics (stderr)")
    ap.add_argument("--stats-json", metavar="FILE", help="write the metrics as JSON")
    ap.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, stats) instead of streaming")
    return ap


def _stats_table(stats: dict, model) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="strata", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [("model", str(model.path.name)), ("threads", str(model.threads)),
            ("prompt tokens", str(stats["prompt_tokens"])), ("prefill tok/s", f"{stats['prefill_tok_s']:.1f}"),
            ("generated tokens", str(stats["generated_tokens"])), ("decode tok/s", f"{stats['decode_tok_s']:.1f}"),
            ("steady-state tok/s (windows after warm-up)", f"{stats['steady_tok_s']:.1f}"),
            ("warm-up (first windows) ms", f"{stats['warmup_ms']:.2f}"),
            ("windows", str(stats["windows"])), ("window ms mean / p50 / p99",
             f"{stats['window_ms_mean']:.2f} / {stats['window_ms_p50']:.2f} / {stats['window_ms_p99']:.2f}")]
    if stats["drafted"]:
        rows += [("drafted / accepted", f"{stats['drafted']} / {stats['accepted']}"),
                 ("acceptance", f"{stats['acceptance']:.3f}"), ("E[keep] realised", f"{stats['e_keep']:.2f}"),
                 ("T histogram", " ".join(f"{k}:{v}" for k, v in stats["t_hist"].items()))]
    for extra in ("draft", "controller", "experts"):
        if extra in stats:
            for k, v in stats[extra].items():
                rows.append((f"{extra}.{k}", str(v)))
    rows.append(("stop", stats["stop"]))
    for r in rows:
        t.add_row(*r)
    Console(stderr=True).print(t)


def _steering_options(a) -> dict:
    """The steering fields of GenerationConfig from the command line (files read here; errors name them)."""
    from .steering import default_phrases, parse_logit_bias, read_phrase_file

    phrases: list = []
    for src in a.ban_phrases:
        phrases += default_phrases() if src == "default" else read_phrase_file(src)
    out: dict = {"ban_phrases": phrases, "stop": list(a.stop), "logit_bias": parse_logit_bias(a.logit_bias),
                 "regex": a.regex}
    if a.json_schema:
        try:
            with open(a.json_schema, encoding="utf-8") as f:
                out["json_schema"] = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{a.json_schema}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if a.grammar:
        with open(a.grammar, encoding="utf-8") as f:
            out["grammar"] = f.read()
    return out


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        cfg = GenerationConfig(max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                               min_p=a.min_p, repetition_penalty=a.repetition_penalty,
                               presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty,
                               penalty_last_n=a.penalty_last_n, seed=a.seed, draft=a.draft, max_draft=a.max_draft,
                               min_match=a.min_match, **_steering_options(a)).validate()
        if a.prompt is not None and a.file:
            raise ValueError("give the prompt as an argument or with --file, not both")
        if a.file:
            with open(a.file, encoding="utf-8") as f:
                prompt = f.read()
        elif a.prompt is not None:
            prompt = a.prompt
        elif not sys.stdin.isatty():
            prompt = sys.stdin.read()
        else:
            raise ValueError("no prompt: pass it as an argument, with --file, or on standard input")
        from .model import Model
        cache_mib = None
        if a.cache_mib is not None and a.cache_mib != "full":
            try:
                cache_mib = int(a.cache_mib)
            except ValueError:
                raise ValueError(f"bad option --cache-mib {a.cache_mib!r}: expected MiB or 'full'") from None
        model = Model.load(a.model, threads=a.threads, mtp=a.mtp, cache_mib=cache_mib, o_direct=a.o_direct,
                           io_threads=a.io_threads, prefetch=not a.no_prefetch, prefetch_root_only=a.prefetch_root_only,
                           routing="approximate" if a.approximate_routing else "natural",
                           approx_protect=a.approx_protect, approx_bonus=a.approx_bonus,
                           approx_draft_protect=a.approx_draft_protect, approx_draft_bonus=a.approx_draft_bonus)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    stats = LoopStats()
    proposer = None
    pieces: list[str] = []
    interrupted = False
    try:
        if not a.json:
            sys.stdout.write(prompt)
            sys.stdout.flush()
        ids = model.tokenizer.encode(prompt)
        dec = TextStream(model.tokenizer, cfg.stop, skip_special=True)
        eog = set(model.tokenizer.eog_ids)
        token_ids: list[int] = []
        proposer = make_proposer(model, cfg)
        for t in generate_ids(model, ids, cfg, stats=stats, proposer=proposer, n_ctx=a.ctx):
            token_ids.append(t)
            if t in eog:
                break
            piece = dec.push(t)
            if piece:
                pieces.append(piece)
                if not a.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            if dec.stopped:
                break
        tail = dec.flush()
        if tail:
            pieces.append(tail)
            if not a.json:
                sys.stdout.write(tail)
    except KeyboardInterrupt:
        interrupted = True
        stats.stop = "interrupted"
    except ValueError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 2
    sd = stats.as_dict()
    if proposer is not None and hasattr(proposer, "stats"):
        sd.update(proposer.stats())  # "draft" / "controller" sub-dicts (engine spec 8)
    if getattr(stats, "experts", None) is not None:  # expert streaming counters of this request
        sd["experts"] = stats.experts
        sd["experts_decode"] = stats.experts_decode
    if a.json:
        print(json.dumps({"prompt": prompt, "text": "".join(pieces), "stats": sd}))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
    if a.stats:
        _stats_table(sd, model)
    if a.stats_json:
        with open(a.stats_json, "w") as f:
            json.dump(sd, f, indent=1)
    return 130 if interrupted else 0


class _CallableModule(type(sys)):
    """`strata_py.generate` names both this module (the CLI: python -m strata_py.generate) and the function
    generate(); importing the module rebinds the package attribute to it, so the module calls the function."""

    def __call__(self, *args, **kwargs):
        return generate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
