"""One options object shared by the CLI, the Python API, the server and the benches.

Every behaviour switch lives here as an explicit field with a default (never an environment variable).
`GenerationConfig.validate()` names the bad field and value.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

# Most drafts in one verify window (the session holds windows of up to 64 rows; 63 drafts are far beyond
# what pays on any machine we measured, but the bound is the engine's, not a tuning choice).
MAX_DRAFT = 63
LLAMACPP_DRY_BREAKERS = ["\n", ":", '"', "*"]  # llama.cpp's and koboldcpp's default DRY sequence breakers


@dataclass
class GenerationConfig:
    # length
    max_tokens: int = 256
    # sampling (temperature 0 = greedy); see csrc/sampling/sampler.h for the exact semantics. The defaults
    # (temperature 0.7, min-p 0.05, DRY 0.8 with the quote as its only breaker) were chosen by measurement on
    # the default model (bench/bench_defaults.py, docs/BENCHMARKS.md "Default settings"); greedy is temperature=0.
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.05
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    # DRY sequence-repetition penalty (csrc/sampling/dry.h; llama.cpp's semantics): off at multiplier 0.
    # Breakers: only the double quote. llama.cpp's set (newline, colon, quote, asterisk: LLAMACPP_DRY_BREAKERS)
    # resets DRY at every line of code, which leaves line loops unpenalised (docs/BENCHMARKS.md).
    dry_multiplier: float = 0.8
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1     # tokens scanned, prompt included; -1 = the whole context, 0 = off
    dry_sequence_breakers: list = field(default_factory=lambda: ['"'])
    seed: int = 0
    # speculative decoding
    draft: str = "auto"          # a name in strata_py.drafting.registry, or "none" (auto: suffix lookup + controller)
    max_draft: int = 15          # drafts per window: a verify window holds up to 1 + max_draft rows
    min_match: int = 4
    fixed_t: int = 0             # 0 = the length controller chooses T; >0 = always this T (experiments)
    stop_at_eos: bool = True
    extra: dict = field(default_factory=dict)
    # steering (issue 15; python/strata_py/steering/, csrc/sampling/processor.h): exact under speculation
    stop: list = field(default_factory=list)          # list[str]: text-level stop strings (not emitted)
    logit_bias: dict = field(default_factory=dict)    # dict[int, float]: token id -> added to its logit (-inf bans)
    ban_phrases: list = field(default_factory=list)   # list[(phrase, strength)]: anti-slop; float("inf") bans
    json_schema: dict | None = None                   # a JSON Schema; {"type": "object"} = OpenAI's json_object
    regex: str | None = None                          # the whole output matches this regular expression
    grammar: str | None = None                        # a Lark grammar (llguidance's dialect) for the output

    def validate(self) -> "GenerationConfig":
        def bad(name, why):
            raise ValueError(f"bad option {name}={getattr(self, name)!r}: {why}")
        if self.max_tokens < 0:
            bad("max_tokens", "must be >= 0")
        if not (self.temperature >= 0.0):
            bad("temperature", "must be >= 0")
        if self.top_k < 0:
            bad("top_k", "must be >= 0 (0 = off)")
        if not (0.0 < self.top_p <= 1.0):
            bad("top_p", "must be in (0, 1]")
        if not (0.0 <= self.min_p < 1.0):
            bad("min_p", "must be in [0, 1)")
        if not (self.repetition_penalty > 0.0):
            bad("repetition_penalty", "must be > 0 (1 = off)")
        if self.penalty_last_n < 0:
            bad("penalty_last_n", "must be >= 0")
        if not (self.dry_multiplier >= 0.0 and self.dry_multiplier < float("inf")):
            bad("dry_multiplier", "must be finite and >= 0 (0 = off)")
        if not (1.0 <= self.dry_base < float("inf")):
            bad("dry_base", "must be finite and >= 1")
        if self.dry_allowed_length < 0:
            bad("dry_allowed_length", "must be >= 0")
        if self.dry_penalty_last_n < -1:
            bad("dry_penalty_last_n", "must be >= -1 (-1 = the whole context, 0 = off)")
        if not isinstance(self.dry_sequence_breakers, (list, tuple)) or \
                not all(isinstance(b, str) and b for b in self.dry_sequence_breakers):
            bad("dry_sequence_breakers", "must be a list of non-empty strings ([] = no breakers)")
        if self.seed < 0 or self.seed >= 2**64:
            bad("seed", "must be in [0, 2**64)")
        if not (0 <= self.max_draft <= MAX_DRAFT):
            bad("max_draft", f"must be in 0..{MAX_DRAFT} (a verify window holds at most {MAX_DRAFT + 1} rows)")
        if self.min_match < 1:
            bad("min_match", "must be >= 1")
        if self.fixed_t < 0:
            bad("fixed_t", "must be >= 0")
        from .steering.options import validate_steering  # the steering fields' own checks
        validate_steering(self, bad)
        return self

    @property
    def max_window(self) -> int:
        """Rows of the largest verify window: the root and up to max_draft drafts."""
        return self.max_draft + 1

    def replace(self, **kw) -> "GenerationConfig":
        names = {f.name for f in fields(self)}
        for k in kw:
            if k not in names:
                raise ValueError(f"unknown option {k!r} (known: {', '.join(sorted(names))})")
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(kw)
        return GenerationConfig(**d).validate()
