"""The step log between the clock thread and the meter: bounded, drained in order, and a failed
write puts the points back in front of newer ones."""

from __future__ import annotations

import pytest

from loraplex.domain.step_metrics import StepPoint
from loraplex.scheduler.step_log import StepLog


def point(i: int) -> StepPoint:
    return StepPoint("run", "alice", "optim_step", {"i:mean": float(i)}, 0, 0, float(i))


def test_the_log_keeps_the_newest_points_and_counts_the_dropped() -> None:
    log = StepLog(max_points=3)
    log.add(point(i) for i in range(5))
    assert [p.wall_time for p in log.drain()] == [2.0, 3.0, 4.0]
    assert log.num_dropped == 2 and log.drain() == []


def test_a_failed_write_keeps_the_points_before_newer_ones() -> None:
    log = StepLog(max_points=10)
    log.add([point(0), point(1)])

    def fail(points: list[StepPoint]) -> None:
        log.add([point(2)])  # the clock thread logs meanwhile
        raise OSError("disk full")

    with pytest.raises(OSError):
        log.drain_into(fail)
    written: list[StepPoint] = []
    assert log.drain_into(written.extend) == 3
    assert [p.wall_time for p in written] == [0.0, 1.0, 2.0]
