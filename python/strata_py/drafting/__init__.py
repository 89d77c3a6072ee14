"""Drafters: one protocol (strata_py.speculative.Proposer) and a registry of named factories.

    @register("suffix")
    def _make(*, model, cfg): return SuffixDrafter(cfg)

    create("auto", model=model, cfg=cfg)  # -> a Proposer; "none" (no drafter) is handled by generate.py

A factory takes the loaded model and the GenerationConfig by keyword and returns an object with
`propose(context, max_drafts) -> list[int]` and `observe(drafts, accepted)`; optionally
`record_window(T, seconds)` (window cost for a length controller), `stats() -> dict` and `finish()`.
"""
from __future__ import annotations

from typing import Callable

_REGISTRY: dict[str, Callable] = {}


def register(name: str):
    """Decorator: register a drafter factory (or class) under `name`; refuses a second one of that name."""
    def deco(factory):
        if name in _REGISTRY:
            raise ValueError(f"drafter {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory
    return deco


def names() -> list[str]:
    """Registered drafter names, sorted."""
    return sorted(_REGISTRY)


def create(name: str, *, model, cfg):
    """A new drafter for one request. Unknown names raise ValueError listing the known ones."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown drafter {name!r} (known: none, {', '.join(names())})")
    return factory(model=model, cfg=cfg)


from . import suffix  # noqa: E402,F401  (registers "suffix" and "auto")
from . import mtp  # noqa: E402,F401  (registers "mtp" and "mtp+suffix")
