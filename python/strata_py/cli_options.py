"""Command-line options shared by generate, serve, chat and the benches: one spelling per option.

    add_model_args(ap)        --model --mtp --threads --cache-mib (routed experts) --expert-source --o-direct ...
    load_model(a)             Model.load(...) from those
    add_generation_args(ap)   GenerationConfig's fields as flags, with its defaults (or the given ones)
    add_constraint_args(ap)   --json-schema --regex --grammar (one generation's output constraint)
    generation_config(a)      the GenerationConfig they spell
"""
from __future__ import annotations

import argparse
import codecs
import json

from .config import GenerationConfig


def add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", "-m", help="GGUF file (default: the model shipped in the package)")
    ap.add_argument("--mtp", metavar="FILE", help="a separate MTP-only GGUF for --draft mtp / mtp+suffix")
    ap.add_argument("--threads", "-t", type=int, default=None, help="default: physical cores")
    ap.add_argument("--cache-mib", default=None, metavar="N|full",
                    help="stream routed experts from the file through a cache of N MiB (default: full = all "
                         "resident); with --backend cuda: the GPU's budget for routed experts, the rest copied in "
                         "as windows route to them (from --expert-source)")
    ap.add_argument("--expert-source", default="auto", choices=("auto", "host", "file"),
                    help="with --backend cuda and --cache-mib: copy missing experts from pinned host memory holding "
                         "all of them (host: fastest, needs RAM for every expert) or read them from the file (file: "
                         "RAM for the page cache only); auto: host when that leaves max(8 GiB, 1/4 of RAM) free")
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
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda", "cpu-backend"),
                    help="where the forward runs: cpu (default), cuda (weights and state on the GPU; needs a CUDA "
                         "build: -Cmake.define.STRATA_CUDA=ON), cpu-backend (the backend forward on the CPU: tests)")
    ap.add_argument("--isa", default=None, choices=("scalar", "avx2", "avx512"),
                    help="use kernels of at most this instruction set (the output of a machine that has no more)")


def load_model(a: argparse.Namespace):
    """Model.load with the options of add_model_args (ValueError names a bad one)."""
    from .model import Model

    if a.isa is not None:
        from . import _core
        _core.limit_isa(a.isa)

    cache_mib = None
    if a.cache_mib is not None and a.cache_mib != "full":
        try:
            cache_mib = int(a.cache_mib)
        except ValueError:
            raise ValueError(f"bad option --cache-mib {a.cache_mib!r}: expected MiB or 'full'") from None
    return Model.load(a.model, threads=a.threads, mtp=a.mtp, cache_mib=cache_mib, o_direct=a.o_direct,
                      io_threads=a.io_threads, prefetch=not a.no_prefetch, prefetch_root_only=a.prefetch_root_only,
                      routing="approximate" if a.approximate_routing else "natural",
                      approx_protect=a.approx_protect, approx_bonus=a.approx_bonus,
                      approx_draft_protect=a.approx_draft_protect, approx_draft_bonus=a.approx_draft_bonus,
                      backend=a.backend, expert_source=a.expert_source)


def add_generation_args(ap: argparse.ArgumentParser, defaults: GenerationConfig | None = None) -> None:
    d = defaults or GenerationConfig()
    ap.add_argument("--max-tokens", "-n", type=int, default=d.max_tokens)
    ap.add_argument("--temperature", "--temp", type=float, default=d.temperature, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=d.top_k)
    ap.add_argument("--top-p", type=float, default=d.top_p)
    ap.add_argument("--min-p", type=float, default=d.min_p)
    ap.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty)
    ap.add_argument("--presence-penalty", type=float, default=d.presence_penalty)
    ap.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty)
    ap.add_argument("--penalty-last-n", type=int, default=d.penalty_last_n)
    ap.add_argument("--dry-multiplier", type=float, default=d.dry_multiplier,
                    help="DRY repetition penalty strength (0 = off): a token extending a repeat of n > allowed "
                         "tokens loses multiplier * base^(n - allowed) of logit")
    ap.add_argument("--dry-base", type=float, default=d.dry_base)
    ap.add_argument("--dry-allowed-length", type=int, default=d.dry_allowed_length)
    ap.add_argument("--dry-penalty-last-n", type=int, default=d.dry_penalty_last_n,
                    help="tokens DRY scans (-1 = the whole context, 0 = off)")
    ap.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="TEXT",
                    help="a DRY sequence breaker (repeatable; replaces the default, the double quote; "
                         "escapes such as \\n are decoded; none = no breaker; llama.cpp's set: \\n : '\"' *)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--draft", default=d.draft, help="speculative drafter: none, suffix, auto, mtp, mtp+suffix")
    ap.add_argument("--max-draft", type=int, default=d.max_draft,
                    help="most drafts per verify window (windows of up to 1 + N rows; auto chooses fewer when they do not pay)")
    ap.add_argument("--min-match", type=int, default=d.min_match)
    # steering (issue 15): exact under speculation
    ap.add_argument("--ban-phrases", action="append", default=[], metavar="FILE|default",
                    help="anti-slop phrases: one a line, optionally TAB strength (inf = ban); 'default' = the shipped "
                         "list; repeatable (the lists add up)")
    ap.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable; not printed)")
    ap.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                    help="add BIAS to token ID's logit (repeatable; -inf bans the token)")


def add_constraint_args(ap: argparse.ArgumentParser) -> None:
    """Output constraints for one generation (the server takes them per request, as response_format)."""
    ap.add_argument("--json-schema", metavar="FILE", help="constrain the output to JSON valid under this schema")
    ap.add_argument("--regex", help="constrain the output to match this regular expression")
    ap.add_argument("--grammar", metavar="FILE", help="constrain the output to this Lark grammar (llguidance dialect)")


def steering_options(a: argparse.Namespace) -> dict:
    """The steering fields of GenerationConfig from the command line (files read here; errors name them)."""
    from .steering import default_phrases, parse_logit_bias, read_phrase_file

    phrases: list = []
    for src in a.ban_phrases:
        phrases += default_phrases() if src == "default" else read_phrase_file(src)
    out: dict = {"ban_phrases": phrases, "stop": list(a.stop), "logit_bias": parse_logit_bias(a.logit_bias),
                 "regex": getattr(a, "regex", None)}
    if getattr(a, "json_schema", None):
        try:
            with open(a.json_schema, encoding="utf-8") as f:
                out["json_schema"] = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{a.json_schema}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if getattr(a, "grammar", None):
        with open(a.grammar, encoding="utf-8") as f:
            out["grammar"] = f.read()
    return out


def generation_config(a: argparse.Namespace) -> GenerationConfig:
    """The GenerationConfig of add_generation_args' (and add_constraint_args') options."""
    return GenerationConfig(max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                            min_p=a.min_p, repetition_penalty=a.repetition_penalty,
                            presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty,
                            penalty_last_n=a.penalty_last_n, seed=a.seed, draft=a.draft, max_draft=a.max_draft,
                            min_match=a.min_match, **dry_options(a), **steering_options(a)).validate()


def dry_options(a: argparse.Namespace) -> dict:
    """The dry_* fields of GenerationConfig from the command line (breakers: escapes such as \\n decoded)."""
    out = {"dry_multiplier": a.dry_multiplier, "dry_base": a.dry_base, "dry_allowed_length": a.dry_allowed_length,
           "dry_penalty_last_n": a.dry_penalty_last_n}
    if a.dry_sequence_breaker is not None:
        out["dry_sequence_breakers"] = [] if a.dry_sequence_breaker == ["none"] else [
            codecs.decode(b, "unicode_escape") if "\\" in b else b for b in a.dry_sequence_breaker]
    return out
