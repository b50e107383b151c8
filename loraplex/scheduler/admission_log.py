"""Admission and backpressure events: each submit the scheduler refused (HTTP 429: the tenant
was at its in-flight limit, or held too many unfetched results), with when, who, what and why.

A ring of the latest ``max_events`` (the per-tenant totals since start stay in
`SchedulerMetrics`' counters). Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionEvent:
    """One refused submit.

    Attributes:
        wall_time: ``time.time()`` of the refusal.
        kind: the op's request type.
        reason: the error message the client got.
    """

    wall_time: float
    tenant: str
    kind: str
    reason: str


class AdmissionLog:
    def __init__(self, max_events: int = 1000) -> None:
        self._lock = threading.Lock()
        self._events: deque[AdmissionEvent] = deque(maxlen=max_events)

    def refused(self, tenant: str, kind: str, reason: str) -> None:
        with self._lock:
            self._events.append(AdmissionEvent(time.time(), tenant, kind, reason))

    def recent(self) -> list[AdmissionEvent]:
        """The kept events, oldest first."""
        with self._lock:
            return list(self._events)
