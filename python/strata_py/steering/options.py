"""The steering fields of GenerationConfig: their checks, and the file / command-line forms they come in.

    stop          list[str]                 text-level stop strings (the stop string itself is never emitted)
    logit_bias    dict[int, float]          added to a token's logit before sampling; -inf bans the token
    ban_phrases   list[(str, float)]        anti-slop phrases with strengths; float("inf") bans the phrase
    json_schema   dict | None               a JSON Schema ({"type": "object"}: any JSON object, OpenAI's json_object)
    regex         str | None                the whole output matches this regular expression
    grammar       str | None                a Lark grammar in llguidance's dialect

At most one of json_schema, regex and grammar. Every check names the field and the bad value.
"""
from __future__ import annotations

import math
from pathlib import Path


def validate_steering(cfg, bad) -> None:
    """Check cfg's steering fields; bad(name, why) raises the ValueError."""
    if not isinstance(cfg.stop, (list, tuple)) or not all(isinstance(s, str) and s for s in cfg.stop):
        bad("stop", "must be a list of non-empty strings")
    if not isinstance(cfg.logit_bias, dict):
        bad("logit_bias", "must be a dict {token id: bias}")
    for k, v in cfg.logit_bias.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            bad("logit_bias", f"key {k!r} is not a token id (an int >= 0)")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v == math.inf:
            bad("logit_bias", f"bias {v!r} of token {k} must be a finite number or -inf (a ban)")
    if not isinstance(cfg.ban_phrases, (list, tuple)):
        bad("ban_phrases", "must be a list of (phrase, strength) pairs")
    for item in cfg.ban_phrases:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            bad("ban_phrases", f"entry {item!r} is not a (phrase, strength) pair")
        phrase, strength = item
        if not isinstance(phrase, str) or not phrase.strip():
            bad("ban_phrases", f"phrase {phrase!r} must be a non-empty string")
        if "\n" in phrase or "\r" in phrase:
            bad("ban_phrases", f"phrase {phrase!r} spans lines (phrases never cross newlines)")
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not (strength > 0):
            bad("ban_phrases", f"strength {strength!r} of {phrase!r} must be > 0 (inf = ban)")
    if cfg.json_schema is not None and not isinstance(cfg.json_schema, dict):
        bad("json_schema", "must be a JSON Schema object (a dict)")
    if cfg.regex is not None and (not isinstance(cfg.regex, str) or not cfg.regex):
        bad("regex", "must be a non-empty string")
    if cfg.grammar is not None and (not isinstance(cfg.grammar, str) or not cfg.grammar.strip()):
        bad("grammar", "must be a non-empty Lark grammar")
    given = [n for n in ("json_schema", "regex", "grammar") if getattr(cfg, n) is not None]
    if len(given) > 1:
        bad(given[1], f"cannot be combined with {given[0]} (one output constraint at a time)")


def read_phrase_file(path: str | Path) -> list[tuple[str, float]]:
    """Phrases from a file: one a line, optionally a tab and a strength ("inf" bans); blank lines and lines
    starting with '#' are skipped. A phrase without a strength gets DEFAULT_STRENGTH."""
    from .phrases import DEFAULT_STRENGTH

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such phrase file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    out: list[tuple[str, float]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        phrase, sep, strength = line.partition("\t")
        value = DEFAULT_STRENGTH
        if sep:
            try:
                value = float(strength.strip())
            except ValueError:
                raise ValueError(f"{path}:{n}: bad strength {strength.strip()!r} (a number > 0, or inf)") from None
            if not value > 0:
                raise ValueError(f"{path}:{n}: bad strength {strength.strip()!r} (a number > 0, or inf)")
        if not phrase.strip():
            raise ValueError(f"{path}:{n}: empty phrase")
        out.append((phrase.strip(), value))
    return out


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    """--logit-bias ID=BIAS (repeatable; BIAS may be -inf) -> {id: bias}."""
    out: dict[int, float] = {}
    for it in items:
        tid, sep, val = it.partition("=")
        try:
            if not sep:
                raise ValueError
            k, v = int(tid), float(val)
        except ValueError:
            raise ValueError(f"bad option --logit-bias {it!r}: expected ID=BIAS, e.g. 42=-5 or 42=-inf") from None
        out[k] = v
    return out
