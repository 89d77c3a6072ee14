"""Expert streaming counters per request (engine spec 6 and 8): the Model's counters are cumulative (it may
serve several sessions), so a request reports the difference between two snapshots, with the rates
recomputed from the differences."""
from __future__ import annotations

# counters that add up; everything else in Model.expert_stats() describes the configuration
COUNTERS = ("lookups", "hits", "hits_inflight", "sync_misses", "evictions", "bytes_read", "experts_read",
            "read_errors", "late_waits", "late_wait_s", "union_layers", "degraded_groups", "prefetch_issued",
            "prefetch_used", "prefetch_wasted", "_union_sum")


def snapshot(model) -> dict:
    """Model.expert_stats() plus the raw sums behind its means and rates."""
    s = dict(model.expert_stats())
    if s.get("streaming"):
        s["_union_sum"] = s["union_mean"] * s["union_layers"]
    return s


def delta(before: dict, after: dict, tokens: int = 0) -> dict:
    """Counters of `after` minus `before` (rates recomputed); per-token bytes when tokens > 0."""
    if not after.get("streaming"):
        return {"streaming": False}
    d = {k: v for k, v in after.items() if not k.startswith("_")}
    for k in COUNTERS:
        if k in after and not k.startswith("_"):
            d[k] = after[k] - before.get(k, 0)
    d["hit_rate"] = d["hits"] / d["lookups"] if d["lookups"] else 0.0
    ul = d["union_layers"]
    d["union_mean"] = (after["_union_sum"] - before.get("_union_sum", 0.0)) / ul if ul else 0.0
    d["bytes_read_mib"] = d["bytes_read"] / 2**20
    if tokens > 0:
        d["bytes_read_per_token"] = d["bytes_read"] / tokens
    # prefetch precision / recall stay cumulative (since load or reset_expert_stats): a predictor property
    return d
