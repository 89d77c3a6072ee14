"""Server counters, rendered as Prometheus' text exposition format (version 0.0.4) at GET /metrics.

Every metric is declared once in METRICS (name, type, help); inc / set / observe refuse undeclared names, so a
typo cannot create a series silently. Summaries are exported as <name>_sum and <name>_count. Thread-safe: the
timeline's worker and the request handlers update them concurrently.
"""
from __future__ import annotations

import math
import threading

METRICS = {
    "strata_requests_total": ("counter", "Requests answered, by route and HTTP status."),
    "strata_requests_rejected_total": ("counter", "Requests refused with 503 because the queue was full."),
    "strata_requests_cancelled_total": ("counter", "Requests whose client went away before the answer ended."),
    "strata_queue_length": ("gauge", "Requests waiting behind the one decoding."),
    "strata_prompt_tokens_total": ("counter", "Prompt tokens of finished requests."),
    "strata_prompt_tokens_cached_total": ("counter", "Prompt tokens restored from a checkpoint instead of computed."),
    "strata_generated_tokens_total": ("counter", "Tokens generated."),
    "strata_drafted_tokens_total": ("counter", "Draft tokens offered to verify windows."),
    "strata_accepted_tokens_total": ("counter", "Draft tokens accepted."),
    "strata_draft_acceptance_ratio": ("gauge", "Accepted / drafted tokens since start."),
    "strata_windows_total": ("counter", "Decode windows (forward passes) run."),
    "strata_prefill_seconds_total": ("counter", "Seconds spent computing prompts."),
    "strata_decode_seconds_total": ("counter", "Seconds spent decoding (drafting included)."),
    "strata_decode_tokens_per_second": ("gauge", "Generated tokens per decode second, since start."),
    "strata_prefill_tokens_per_second": ("gauge", "Computed prompt tokens per prefill second, since start."),
    "strata_time_to_first_token_seconds": ("summary", "From a request's arrival to its first token."),
    "strata_queue_wait_seconds": ("summary", "From a request's arrival to the start of its work."),
    "strata_prefix_cache_lookups_total": ("counter", "Checkpoint lookups."),
    "strata_prefix_cache_hits_total": ("counter", "Lookups that restored a checkpoint (or kept the live state)."),
    "strata_prefix_cache_entries": ("gauge", "Checkpoints held."),
    "strata_prefix_cache_bytes": ("gauge", "Bytes of checkpoints held."),
    "strata_prefix_cache_budget_bytes": ("gauge", "The checkpoint ring's budget (--prompt-cache-mib)."),
    "strata_prefix_cache_evictions_total": ("counter", "Checkpoints evicted to stay within the budget."),
}


def _labels(labels: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple], float] = {}

    def _check(self, name: str, kinds: tuple[str, ...]) -> None:
        if name not in METRICS:
            raise KeyError(f"undeclared metric {name!r}")
        if METRICS[name][0] not in kinds:
            raise KeyError(f"metric {name!r} is a {METRICS[name][0]}, not a {'/'.join(kinds)}")

    def inc(self, name: str, value: float = 1.0, **labels) -> None:
        self._check(name, ("counter",))
        key = (name, _labels(labels))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels) -> None:
        self._check(name, ("gauge",))
        with self._lock:
            self._values[(name, _labels(labels))] = float(value)

    def observe(self, name: str, value: float) -> None:
        self._check(name, ("summary",))
        with self._lock:
            for suffix, v in (("_sum", value), ("_count", 1.0)):
                key = (name + suffix, ())
                self._values[key] = self._values.get(key, 0.0) + v

    def get(self, name: str, **labels) -> float:
        with self._lock:
            return self._values.get((name, _labels(labels)), 0.0)

    def render(self) -> str:
        """The text exposition: HELP and TYPE for every declared metric, then its samples."""
        with self._lock:
            values = dict(self._values)
        out = []
        for name, (kind, help_) in METRICS.items():
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            if kind == "summary":
                for n in (name + "_sum", name + "_count"):
                    out.append(f"{n} {_fmt(values.get((n, ()), 0.0))}")
                continue
            samples = sorted((labels, v) for (n, labels), v in values.items() if n == name) or [((), 0.0)]
            for labels, v in samples:
                lab = ",".join(f'{k}="{_escape(val)}"' for k, val in labels)
                out.append(f"{name}{{{lab}}} {_fmt(v)}" if lab else f"{name} {_fmt(v)}")
        return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
