"""The server's own options (one dataclass; generation options are GenerationConfig's, model options are
Model.load's arguments): shared by `python -m strata_py.serve`, `python -m strata_py.chat` and the benches.

Two memory budgets, not to be confused:
  --cache-mib N          the routed-expert cache (Model.load(cache_mib=N)), as in `python -m strata_py.generate`
  --prompt-cache-mib N   the ring of prefix checkpoints (prefix_cache.py) that lets a turn reuse the last one
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"            # loopback by default: the server is reachable from this machine only
    port: int = 8080
    api_key: str | None = None         # required as "Authorization: Bearer KEY" on every route but /health
    cors_origins: list = field(default_factory=list)  # list[str] of allowed origins ("*": any)
    max_queue: int = 16                # requests waiting behind the running one; one more answers 503
    ctx: int | None = None             # the timeline's context (KV cells); None: min(model's, 32768)
    prompt_cache_mib: int = 1024       # the checkpoint ring's budget (MiB); 0 = no prefix reuse
    checkpoint_gap: int = 256          # message-boundary checkpoints inside a prompt: at least this many tokens apart
    slot_save: str | None = None       # a directory: the ring is written there on shutdown and read back at start
    chat_template_file: str | None = None  # overrides the GGUF's tokenizer.chat_template
    model_alias: str | None = None     # the model's id in the API (default: the GGUF file name without .gguf)
    seed: int | None = None            # the seed of a sampled request that names none (None: a fresh random seed)
    default_max_tokens: int | None = None  # a request without max_tokens: this many (None: the rest of the context)

    def validate(self) -> "ServerOptions":
        def bad(name, why):
            raise ValueError(f"bad option {name}={getattr(self, name)!r}: {why}")
        if not (0 < self.port < 65536):
            bad("port", "must be in 1..65535")
        if self.api_key is not None and not self.api_key:
            bad("api_key", "must not be empty")
        if self.max_queue < 0:
            bad("max_queue", "must be >= 0")
        if self.ctx is not None and self.ctx < 2:
            bad("ctx", "must be >= 2")
        if self.prompt_cache_mib < 0:
            bad("prompt_cache_mib", "must be >= 0 (0 = no prefix reuse)")
        if self.checkpoint_gap < 1:
            bad("checkpoint_gap", "must be >= 1")
        if self.seed is not None and not (0 <= self.seed < 2**64):
            bad("seed", "must be in [0, 2**64)")
        if self.default_max_tokens is not None and self.default_max_tokens < 0:
            bad("default_max_tokens", "must be >= 0")
        return self
