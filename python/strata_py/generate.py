"""Text generation: the `generate()` API and the `python -m strata_py.generate` CLI.

    python -m strata_py.generate "def parse_args("                      # shipped default model
    python -m strata_py.generate --chat "Return the sum of the squares of a list of numbers."   # one chat turn
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

from .cli_options import add_constraint_args, add_generation_args, add_model_args, generation_config, load_model
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
                 session=None, proposer=None, n_ctx: int | None = None, on_commit=None, steering=None,
                 **options) -> Iterator[int]:
    """Yield generated token ids for a tokenized prompt (plain or speculative decoding, same output).

    A given session may already hold a prefix of the prompt (all but its last token at most: the server's
    prefix reuse restores a checkpoint); only the rest is prefilled. on_commit, steering: see speculative.decode."""
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
    held = session.position
    if held and (held >= len(ids) or session.tokens != ids[:held]):
        raise ValueError(f"the session holds {held} tokens that are not a prefix of the prompt's first {len(ids) - 1}")
    stats.cached_tokens = held
    streaming = getattr(model, "streaming", False)
    if streaming:  # expert counters of this request: stats.experts (prefill + decode), stats.experts_decode
        from . import experts as _experts
        e0 = _experts.snapshot(model)
    t0 = time.perf_counter()
    prefill(session, ids[held:-1])
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
        yield from decode(session, ids[-1], cfg, eog, stats, proposer, choose, on_commit=on_commit, steering=steering)
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


def chat_prompt(model, request: str, cfg: GenerationConfig, template_file=None) -> tuple[str, GenerationConfig]:
    """One user message rendered through the model's chat template (server/templates.py: the GGUF's, or the
    shipped model's data/strata-default.jinja), and cfg with the template's plain-text end-of-turn markers
    added as stop strings, as the server and the chat do."""
    from .server.templates import ChatTemplate, NoTemplate, TemplateError

    try:
        tpl = ChatTemplate.for_model(model, template_file)
        text = tpl.render([{"role": "user", "content": request}], add_generation_prompt=True)
    except (NoTemplate, TemplateError) as e:
        raise ValueError(f"--chat: {e}") from None
    stops = [m for m in tpl.stop_texts(model.tokenizer) if m not in cfg.stop]
    return text, (cfg.replace(stop=list(cfg.stop) + stops) if stops else cfg)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m strata_py.generate", description="Generate text with a Qwen3-Next GGUF.")
    ap.add_argument("prompt", nargs="?", help="prompt text (or --file, or standard input)")
    ap.add_argument("--file", "-f", help="read the prompt from this file")
    ap.add_argument("--chat", metavar="REQUEST", help="send REQUEST as one user message through the model's chat "
                    "template (the one-shot chat; only the answer is printed)")
    ap.add_argument("--chat-template-file", metavar="FILE", help="with --chat: this Jinja template instead of the model's")
    add_model_args(ap)
    add_generation_args(ap)
    add_constraint_args(ap)
    ap.add_argument("--ctx", type=int, default=None, help="context size (default: prompt + max tokens, >= 4096)")
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


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        cfg = generation_config(a)
        if sum(x is not None for x in (a.prompt, a.file, a.chat)) > 1:
            raise ValueError("give the prompt as an argument, with --file or with --chat, not two of them")
        if a.chat is not None:
            prompt = a.chat
        elif a.file:
            with open(a.file, encoding="utf-8") as f:
                prompt = f.read()
        elif a.prompt is not None:
            prompt = a.prompt
        elif not sys.stdin.isatty():
            prompt = sys.stdin.read()
        else:
            raise ValueError("no prompt: pass it as an argument, with --file, or on standard input")
        model = load_model(a)
        text = prompt
        if a.chat is not None:
            text, cfg = chat_prompt(model, a.chat, cfg, a.chat_template_file)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    stats = LoopStats()
    proposer = None
    pieces: list[str] = []
    interrupted = False
    try:
        if not a.json and a.chat is None:
            sys.stdout.write(prompt)
            sys.stdout.flush()
        ids = model.tokenizer.encode(text)
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
