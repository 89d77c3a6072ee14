"""The one definition of "speculative decoding equals plain decoding" that every exactness test uses (issue 21).

Plain means plain: the reference is always `draft="none"` decoding (every window T = 1, checked), never a run
with the default drafter. Every option that decides the tokens is stated here or by the caller (temperature,
seed, draft, stop_at_eos), never taken from GenerationConfig's defaults, which other work may change.

    cases = exactness.cases(("greedy", "sampled"), seeds=(0, 1, 2))      # (label, cfg) pairs
    exactness.assert_equals_plain(model, prompt, cfg, ["suffix", "auto", "mtp", Adversarial(2)])

A drafter is a registry name (str), a ready proposer object (used as it is), or an `Adversarial(right)`: it drafts plain decoding's own future correctly
for `right` tokens and then one wrong token (right=0: always wrong; right=None: always right), so every T and
keep occurs. tests/test_exactness.py shows that this helper fails when the loop's acceptance rule is wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from strata_py.config import GenerationConfig
from strata_py.speculative import LoopStats

# min-p and DRY stated too: their defaults (issue 20: min-p 0.05, DRY 0.8) would change greedy references
# (DRY moves the argmax); DRY's own exactness is tests/test_dry.py's
GREEDY = dict(temperature=0.0, min_p=0.0, dry_multiplier=0.0)
# sampled verification with every processor that reads the history (top-k, top-p, repetition penalty)
SAMPLED = dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.0, repetition_penalty=1.1, dry_multiplier=0.0)
MODES = {"greedy": GREEDY, "sampled": SAMPLED}
SEEDS = (0, 1, 2)


def config(mode: str = "greedy", seed: int = 0, max_tokens: int = 32, *, stop_at_eos: bool = False,
           **extra) -> GenerationConfig:
    """A GenerationConfig with every token-deciding option stated: the mode's sampler, the seed, draft="none"."""
    opts = dict(MODES[mode], seed=seed, max_tokens=max_tokens, stop_at_eos=stop_at_eos, draft="none")
    opts.update(extra)
    return GenerationConfig(**opts).validate()


def cases(modes: Sequence[str] = ("greedy", "sampled"), seeds: Sequence[int] = SEEDS, max_tokens: int = 32,
          **extra) -> list[tuple[str, GenerationConfig]]:
    """(label, cfg) for greedy (one seed: the seed does not matter) and each seed of the sampled modes."""
    out = []
    for m in modes:
        for s in (seeds[:1] if m == "greedy" else seeds):
            out.append((f"{m} seed={s}", config(m, s, max_tokens, **extra)))
    return out


@dataclass(frozen=True)
class Adversarial:
    """A drafter built from plain decoding's output: right for `right` tokens, then one wrong token."""
    right: int | None

    def make(self, plain: list[int], prompt_len: int, n_vocab: int) -> "Oracle":
        return Oracle(plain, prompt_len, self.right, n_vocab)

    def __str__(self) -> str:
        return f"adversarial(right={self.right})"


class Oracle:
    """Drafts plain decoding's future exactly for `right` tokens, then a wrong token (right=None: always right)."""

    def __init__(self, plain, prompt_len, right, n_vocab):
        self.plain, self.n0, self.right, self.V = plain, prompt_len, right, n_vocab

    def propose(self, context, max_drafts):
        done = len(context) - self.n0  # tokens emitted so far (context = prompt + emitted)
        future = self.plain[done:done + max_drafts]
        if self.right is None:
            return list(future)
        drafts = list(future[:self.right])
        if len(drafts) < max_drafts and len(future) > len(drafts):
            drafts.append((future[len(drafts)] + 1) % self.V)
        return drafts

    def observe(self, drafts, accepted):
        pass


def _generate_ids(model, prompt, cfg, proposer, stats):
    from strata_py.generate import generate_ids
    return list(generate_ids(model, prompt, cfg, stats=stats, proposer=proposer))


def plain(model, prompt: Sequence[int], cfg: GenerationConfig, gen: Callable | None = None) -> list[int]:
    """Plain decoding: draft="none", and every window of the run had one row (checked)."""
    gen = gen or _generate_ids
    st = LoopStats()
    out = gen(model, list(prompt), cfg.replace(draft="none"), None, st)
    assert st.drafted == 0 and set(st.t_hist) <= {1}, f"the plain reference ran windows {st.t_hist}"
    assert st.generated == len(out)
    return out


def assert_equals_plain(model, prompt: Sequence[int], cfg: GenerationConfig, drafters: Sequence, *,
                        ref_model=None, gen: Callable | None = None, label: str = "",
                        reference: list[int] | None = None) -> dict:
    """Each drafter's output equals plain decoding's for `cfg` (its draft field is replaced), token for token.

    ref_model: where plain decoding runs (default `model`; e.g. a fully resident model for a streaming one).
    gen(model, prompt, cfg, proposer, stats) -> ids: how to generate (default generate_ids on a new session).
    reference: plain's output when the caller already has it. Returns {str(drafter): LoopStats} and "plain".
    """
    gen = gen or _generate_ids
    ref = reference if reference is not None else plain(ref_model or model, prompt, cfg, gen)
    stats = {"plain": ref}
    for d in drafters:
        st = LoopStats()
        if isinstance(d, str):
            got = gen(model, list(prompt), cfg.replace(draft=d), None, st)
        else:
            proposer = d.make(ref, len(prompt), model.n_vocab) if isinstance(d, Adversarial) else d
            got = gen(model, list(prompt), cfg.replace(draft="none"), proposer, st)
        n = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
        assert got == ref, (f"{label} draft={d}: {len(got)} tokens vs plain's {len(ref)}, first difference at "
                            f"token {n}: {got[n:n + 4]} vs {ref[n:n + 4]} (T histogram {st.t_hist})")
        stats[str(d)] = st
    return stats


def drafted(stats: dict) -> int:
    """Drafts offered over the drafters of one or more assert_equals_plain results."""
    return sum(st.drafted for k, st in stats.items() if k != "plain")
