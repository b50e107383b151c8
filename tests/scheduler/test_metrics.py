"""Cycle records, counters and utilization: hand-computed values on a clock moved by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loraplex.scheduler.metrics import CycleRecord, SchedulerMetrics
from loraplex.scheduler.runner import run_plan
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import (
    FakeClock,
    create,
    datum,
    drain,
    fwd_bwd,
    make_scheduler,
    optim,
    sample,
)


def record(start: float, engine_s: float, kind: str = "cycle") -> CycleRecord:
    return CycleRecord(index=-1, kind=kind, started_at=start, wall_time=0.0, engine_s=engine_s)


def test_utilization_is_engine_seconds_in_the_window_over_the_window() -> None:
    clock = FakeClock(0.0)
    m = SchedulerMetrics(clock=clock)
    m.record(record(1.0, 2.0), [], {})  # busy [1, 3]
    m.record(record(5.0, 1.0, "sample"), [], {})  # busy [5, 6]
    clock.now = 8.0
    assert m.utilization(8.0) == pytest.approx(3 / 8)
    assert m.utilization(4.0) == pytest.approx(1 / 4)  # [4, 8] holds [5, 6]
    assert m.utilization(6.0) == pytest.approx(2 / 6)  # [2, 8] holds [2, 3] and [5, 6]
    assert m.busy_series(bucket_s=2.0, num_buckets=4) == pytest.approx([0.5, 0.5, 0.5, 0.0])
    assert m.share(window_s=8.0) == pytest.approx({"cycle": 2.0, "sample": 1.0})
    assert [c.index for c in m.recent()] == [0, 1]


def test_the_ring_is_bounded_and_totals_are_not() -> None:
    m = SchedulerMetrics(max_records=3, clock=FakeClock(0.0))
    for i in range(10):
        m.record(record(float(i), 0.5), [], {})
    assert [c.index for c in m.recent()] == [7, 8, 9]
    assert m.calls["cycle"] == 10 and m.engine_s["cycle"] == pytest.approx(5.0)


def test_each_plan_leaves_a_record_with_its_ops_tenants_tokens_and_idle_time(
    toy: ToyExecutor, stores: Stores
) -> None:
    clock = FakeClock(100.0)
    s = make_scheduler(toy, stores, clock=clock)
    s.submit(create("a:train:0"))
    s.submit(create("b:train:0", tenant="bob"))
    drain(s)
    clock.now += 5.0  # the engine sits idle for 5 s
    s.submit(fwd_bwd("a:train:0", 1, [datum([2, 3, 4])]))
    s.submit(optim("a:train:0", 2))
    s.submit(fwd_bwd("b:train:0", 1, [datum([2, 3, 4, 5, 6])], tenant="bob"))
    clock.now += 1.0  # they wait 1 s before the cycle starts
    plan = s.plan()
    assert plan is not None
    s.complete(plan, replace(run_plan(toy, plan), engine_s=0.25, train_s=0.2, optim_s=0.05))
    cycle = s.metrics.recent(1)[0]
    assert (cycle.kind, cycle.tenants, cycle.num_models, cycle.num_ops, cycle.num_tokens) == (
        "cycle", ("alice", "bob"), 2, 3, 8)
    assert cycle.idle_s == pytest.approx(6.0) and cycle.max_wait_s == pytest.approx(1.0)
    assert (cycle.engine_s, cycle.train_s, cycle.optim_s) == (0.25, 0.2, 0.05)
    alice, bob = s.metrics.tenants["alice"], s.metrics.tenants["bob"]
    assert alice.ops == {"CreateModel": 1, "ForwardBackward": 1, "OptimStep": 1}
    assert (alice.usage.trained_tokens, bob.usage.trained_tokens) == (3, 5)
    # The batch's 0.2 s is shared by tokens (3 : 5), alice's optim step takes the 0.05 s.
    assert alice.usage.engine_s - _create_s(s, "alice") == pytest.approx(0.2 * 3 / 8 + 0.05)
    assert bob.usage.engine_s - _create_s(s, "bob") == pytest.approx(0.2 * 5 / 8)


def _create_s(s, tenant: str) -> float:  # type: ignore[no-untyped-def]
    return sum(c.engine_s for c in s.metrics.recent() if c.kind == "control"
               and c.tenants == (tenant,))


def test_rejections_and_queue_depths_are_counted(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores, max_inflight_per_tenant=2)
    s.submit(sample([2, 3]))
    s.submit(sample([2, 3]))
    with pytest.raises(Exception, match="in flight"):
        s.submit(sample([2, 3]))
    assert s.metrics.tenants["alice"].rejected == {"Sample": 1}
    assert s.queue_depths()["alice"] == {"train_waiting": 0, "sample_waiting": 2,
                                         "sample_running": 0, "inflight": 2}
