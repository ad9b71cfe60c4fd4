"""Counters and histograms that many worker processes fill together: each process
counts locally and adds its counts to the batch's counters in Redis with its next
fenced write; the metrics endpoint sums them. Bucket bounds live here, in one place."""

from __future__ import annotations

import bisect
from collections import Counter

# Seconds. Generation spans milliseconds (one token) to hours (a long request).
BUCKETS: dict[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    "inter_token_latency_seconds": (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5),
    "request_duration_seconds": (
        0.1,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        30.0,
        60.0,
        120.0,
        300.0,
        600.0,
        1800.0,
        3600.0,
        7200.0,
        14400.0,
    ),
    "checkpoint_write_seconds": (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
}


def field(name: str, part: str) -> str:
    """The counter field of one bucket ("b3"), or of "sum" / "count"."""
    return f"h:{name}:{part}"


class PendingCounts:
    """What this process has counted since its last write."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, name: str, n: float = 1) -> None:
        self.counts[name] += n

    def observe(self, name: str, value: float, n: int = 1) -> None:
        bounds = BUCKETS[name]
        self.counts[field(name, f"b{bisect.bisect_left(bounds, value)}")] += n
        self.counts[field(name, "sum")] += value * n
        self.counts[field(name, "count")] += n

    def drain(self) -> dict[str, float]:
        out = {k: round(v, 6) for k, v in self.counts.items()}
        self.counts.clear()
        return out


def cumulative(name: str, stats: dict[str, float]) -> tuple[list[tuple[str, float]], float]:
    """Prometheus buckets (cumulative, ending with +Inf) and the sum, from counters."""
    bounds = BUCKETS[name]
    buckets, running = [], 0.0
    for i, bound in enumerate(bounds):
        running += stats.get(field(name, f"b{i}"), 0.0)
        buckets.append((repr(float(bound)), running))
    running += stats.get(field(name, f"b{len(bounds)}"), 0.0)
    buckets.append(("+Inf", running))
    return buckets, stats.get(field(name, "sum"), 0.0)
