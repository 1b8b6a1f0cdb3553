"""The engine stats of several data-parallel ranks as one snapshot (for /metrics and the benchmarks).

Gauges (GAUGE_KEYS: the state now) come from the live ranks only: counts summed, the KV-cache usage
their mean. Every other number is a counter and is summed over every rank's last snapshot, a dead
rank's included, so that no counter goes down when a rank dies (Prometheus reads a decrease as a
reset). Lists (per-position counters) are summed position by position. The live ranks' own snapshots
stay under "ranks" (rank number as a string -> stats), for gauges labelled by rank.
"""

from __future__ import annotations

GAUGE_KEYS = ("num_running", "num_waiting", "kv_cache_usage")


def _add(a, b):
    if isinstance(a, list) and isinstance(b, list):
        n = max(len(a), len(b))
        return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    return a


def merge_rank_stats(live: list[dict | None], last: list[dict]) -> dict:
    """`live[r]`: rank r's current stats, None if it is dead; `last[r]`: its last snapshot (maybe {})."""
    merged: dict = {}
    for stats in last:
        for key, value in stats.items():
            if key not in GAUGE_KEYS:
                merged[key] = _add(merged[key], value) if key in merged else value
    current = [s for s in live if s is not None]
    for key in GAUGE_KEYS:
        values = [s.get(key, 0) or 0 for s in current]
        if key == "kv_cache_usage":
            merged[key] = sum(values) / len(values) if values else 0.0
        else:
            merged[key] = sum(values)
    merged["ranks"] = {str(r): s for r, s in enumerate(live) if s is not None}
    merged["dead_ranks"] = [r for r, s in enumerate(live) if s is None]
    return merged
