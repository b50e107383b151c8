"""Training metrics hook: the metrics of each finished forward_backward, forward and optim_step
op, kept in memory until the server's meter moves them to the run-metrics store.

Like the usage log: the clock thread only appends (no I/O on it), the meter drains every few
seconds, and the log is bounded (past ``max_points`` undrained points the oldest are dropped
and counted, so a scheduler without a meter keeps the latest).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from loraplex.domain.ops import WorkItem
from loraplex.domain.results import ForwardBackwardResult, ItemOutcome, OptimStepResult
from loraplex.domain.step_metrics import StepPoint
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork


class StepLog:
    """Bounded log of `StepPoint`s, safe to drain from another thread."""

    def __init__(self, max_points: int = 100_000) -> None:
        self.max_points = max_points
        self._lock = threading.Lock()
        self._drain_lock = threading.Lock()
        self._points: deque[StepPoint] = deque(maxlen=max_points)
        self.num_dropped = 0

    def add(self, points: Iterable[StepPoint]) -> None:
        with self._lock:
            for point in points:
                if len(self._points) == self._points.maxlen:
                    self.num_dropped += 1
                self._points.append(point)

    def drain(self) -> list[StepPoint]:
        with self._lock:
            out = list(self._points)
            self._points.clear()
            return out

    def drain_into(self, write: Callable[[list[StepPoint]], None]) -> int:
        """Drain and hand the points to ``write``, one drainer at a time, so two drainers (the
        meter, a dashboard request) never write a later point before an earlier one; the clock
        thread's `add` does not wait for it. If ``write`` fails, the points go back in front.

        Returns:
            how many points were written.
        """
        with self._drain_lock:
            points = self.drain()
            if not points:
                return 0
            try:
                write(points)
            except BaseException:
                with self._lock:
                    kept = [*points, *self._points][-self.max_points:]
                    self._points = deque(kept, maxlen=self.max_points)
                raise
            return len(points)


def step_point(item: WorkItem, result: ItemOutcome) -> StepPoint | None:
    """The metrics point of a successful training op (None for every other op or outcome)."""
    op = item.op
    if isinstance(op, ForwardBackwardWork) and isinstance(result, ForwardBackwardResult):
        return StepPoint(op.adapter_id, item.tenant,
                         "forward" if op.forward_only else "forward_backward",
                         dict(result.metrics), len(op.data), op.num_tokens, time.time())
    if isinstance(op, OptimStepWork) and isinstance(result, OptimStepResult):
        return StepPoint(op.adapter_id, item.tenant, "optim_step", dict(result.metrics), 0, 0,
                         time.time())
    return None
