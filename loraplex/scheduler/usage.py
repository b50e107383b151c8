"""Metering hook: one record per finished op and one per engine call (clock cycle).

The scheduler fills these on completion; pricing and per-tenant reports (issue 6) and the
stats / metrics endpoints (issue 5) read them. Engine time of a packed call is shared among
its ops in proportion to their tokens.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class OpUsage:
    """What one op consumed.

    Attributes:
        kind: the op's request type (``ForwardBackward``, ``Sample``, ...).
        engine_s: its share of the engine call's wall time.
        trained_tokens: datum tokens of a forward_backward (0 for a forward).
        forward_tokens: datum tokens of a forward-only pass.
        prefill_tokens: prompt tokens a sample request prefilled.
        cache_hit_tokens: prompt tokens served from the prefix cache.
        sampled_tokens: tokens generated.
    """

    request_id: str
    tenant: str
    model_id: str | None
    kind: str
    engine_s: float
    trained_tokens: int = 0
    forward_tokens: int = 0
    prefill_tokens: int = 0
    cache_hit_tokens: int = 0
    sampled_tokens: int = 0


@dataclass(frozen=True)
class CycleRecord:
    """One engine call.

    Attributes:
        plan: plan kind (``train``, ``optim``, ``control``, ``sample``, ``release``).
        started_at: monotonic start time.
        engine_s: wall time inside the executor.
        tenants: distinct tenants served.
        num_ops: ops carried (admitted + finished for samples).
        num_tokens: datum / prompt tokens carried.
    """

    plan: str
    started_at: float
    engine_s: float
    tenants: tuple[str, ...]
    num_ops: int
    num_tokens: int


class UsageLog:
    """Bounded in-memory log, safe to read from other threads."""

    def __init__(self, max_records: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._ops: deque[OpUsage] = deque(maxlen=max_records)
        self._cycles: deque[CycleRecord] = deque(maxlen=max_records)

    def add(self, cycle: CycleRecord, ops: Iterable[OpUsage]) -> None:
        with self._lock:
            self._cycles.append(cycle)
            self._ops.extend(ops)

    def drain_ops(self) -> list[OpUsage]:
        with self._lock:
            out = list(self._ops)
            self._ops.clear()
            return out

    def recent_cycles(self, n: int = 1000) -> list[CycleRecord]:
        with self._lock:
            return list(self._cycles)[-n:]
