"""A latency histogram with fixed buckets (cumulative counts, sum, count), the shape a
Prometheus histogram exposes; the scheduler keeps one per queue and per request kind."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0, 60.0, 300.0)
"""Upper bounds in seconds: from a sub-millisecond scheduler hop to a five-minute queue."""


@dataclass
class Histogram:
    """Observations counted per bucket (upper bounds ``bounds``; the last bucket is +Inf).

    Not thread-safe by itself: its owner holds a lock around `observe` and `snapshot`.
    """

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations ≤ it)`` per bucket, ending with ``(inf, count)``."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)
