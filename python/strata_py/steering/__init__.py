"""Steered decoding (issue 15): logit bias, anti-slop phrase penalties, grammar constraints and stop strings,
all exact under speculation (a window emits exactly what serial decoding would).

Who does what:
  - C++ (csrc/sampling/processor.h): the logit bias, the DRY penalty (dry.py) and the phrase automaton live in the session
    (Session.set_steering); their state follows the committed tokens since the generation's origin.
  - grammar.py: the llguidance matcher, one per generation, hands each window its per-row token masks
    (computed while the window's forward pass runs) and rolls back rejected rows.
  - stop.py: stop strings, cut in the decode loop like an end-of-generation token, held back in streams.

    steer = Steering(model, cfg)            # None-like (not .active) when cfg asks for nothing
    steer.attach(session, origin)           # origin: position of the generation's first output token
    masks = steer.masks(inputs, pos0)       # per window (None without a grammar); or steer.mask_fn(...)
    steer.commit(keep)                      # after session.commit(keep)
"""
from __future__ import annotations

from typing import Sequence

from .dry import dry_penalty
from .grammar import GrammarMatcher, grammar_text
from .options import parse_logit_bias, read_phrase_file, validate_steering
from .phrases import automaton, default_phrases
from .stop import TextStream

__all__ = ["Steering", "TextStream", "default_phrases", "read_phrase_file", "parse_logit_bias",
           "validate_steering"]


class Steering:
    """One generation's processors for `model` under `cfg` (see the module docstring)."""

    def __init__(self, model, cfg, max_window: int | None = None):
        from .. import _core

        self.core = None
        dry = dry_penalty(model, cfg)
        if cfg.logit_bias or cfg.ban_phrases or dry is not None:
            ids = sorted(cfg.logit_bias)
            for t in ids:
                if t >= model.n_vocab:
                    raise ValueError(f"bad option logit_bias: token id {t} is outside the vocabulary [0, {model.n_vocab})")
            phrases = automaton(model, cfg.ban_phrases) if cfg.ban_phrases else None
            self.core = _core.Steering(model.n_vocab, ids, [float(cfg.logit_bias[t]) for t in ids], phrases, dry)
        g = grammar_text(cfg)
        self.grammar = GrammarMatcher(model, g[0], g[1], max_window or cfg.max_window) if g else None

    @property
    def active(self) -> bool:
        return self.core is not None or self.grammar is not None

    def attach(self, session, origin: int) -> None:
        """Give the session these processors for a generation whose first output token is at `origin`."""
        session._core.set_steering(self.core, origin)
        if self.grammar is not None:
            self.grammar.sync(session.tokens, origin)

    def masks(self, inputs: Sequence[int], pos0: int):
        """The window's token masks (uint32 [T, words]) or None without a grammar."""
        return None if self.grammar is None else self.grammar.window_masks(inputs, pos0)

    def mask_fn(self, inputs: Sequence[int], pos0: int):
        """A callable computing masks(inputs, pos0), for run_sample to call while the forward runs (or None)."""
        if self.grammar is None:
            return None
        g = self.grammar
        return lambda: g.window_masks(inputs, pos0)

    def commit(self, keep: int) -> None:
        if self.grammar is not None:
            self.grammar.commit(keep)
