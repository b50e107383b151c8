"""Cycle records, counters and utilization: hand-computed values on a clock moved by hand."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from loraplex.scheduler.admission_log import AdmissionLog
from loraplex.scheduler.metrics import CycleRecord, SchedulerMetrics
from loraplex.scheduler.runner import run_plan
from loraplex.scheduler.tenant_waits import TenantWaits
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
    [event] = s.metrics.admissions.recent()
    assert (event.tenant, event.kind) == ("alice", "Sample") and "in flight" in event.reason
    assert s.queue_depths()["alice"] == {"train_waiting": 0, "sample_waiting": 2,
                                         "sample_running": 0, "inflight": 2}


def test_busy_series_matches_the_overlap_of_each_bucket_computed_one_by_one() -> None:
    rng = random.Random(3)
    clock = FakeClock(0.0)
    m = SchedulerMetrics(clock=clock)
    records, t = [], 0.0
    for _ in range(250):  # plans one after another, with IO records (no engine time) between
        t += rng.uniform(0, 0.3)
        records.append(record(t, rng.uniform(0, 0.4)))
        t += records[-1].engine_s
        if rng.random() < 0.3:
            records.append(record(rng.uniform(0, t), 0.0, "io"))
    for r in records:
        m.record(r, [], {})
    assert t < 100
    clock.now = 101.0
    expected = []
    for i in range(30):
        a, b = 101.0 - 3.0 * (30 - i), 101.0 - 3.0 * (29 - i)
        busy = sum(max(0.0, min(r.started_at + r.engine_s, b) - max(r.started_at, a))
                   for r in records)
        expected.append(min(1.0, busy / 3.0))
    assert m.busy_series(bucket_s=3.0, num_buckets=30) == pytest.approx(expected, abs=1e-9)
    for window in (1.0, 10.0, 60.0, 200.0):
        assert m.utilization(window) == pytest.approx(min(1.0, sum(
            max(0.0, min(r.started_at + r.engine_s, 101.0) - max(r.started_at, 101.0 - window))
            for r in records) / min(window, 101.0)), abs=1e-9)


def test_after_returns_the_records_past_a_cursor_newest_limit_first_kept() -> None:
    m = SchedulerMetrics(max_records=5, clock=FakeClock(0.0))
    for i in range(8):  # indices 0..7, the ring keeps 3..7
        m.record(record(float(i), 0.1), [], {})
    assert [c.index for c in m.after(-1, 100)] == [3, 4, 5, 6, 7]
    assert [c.index for c in m.after(5, 100)] == [6, 7]
    assert [c.index for c in m.after(-1, 2)] == [6, 7]
    assert m.after(7, 100) == [] and m.after(-1, 0) == []


def test_queue_waits_are_kept_per_tenant_and_bounded() -> None:
    waits = TenantWaits(max_values=3, max_tenants=2)
    waits.observe("train", [("a", 1.0), ("a", 2.0), ("b", 5.0)])
    waits.observe("train", [("a", 3.0), ("a", 4.0)])
    waits.observe("sample", [("a", 0.5)])
    assert waits.snapshot() == {"b": {"train": [5.0]},
                                "a": {"train": [2.0, 3.0, 4.0], "sample": [0.5]}}
    waits.observe("train", [("c", 1.0)])  # a third tenant: the least recently seen goes
    assert set(waits.snapshot()) == {"a", "c"}


def test_the_admission_log_keeps_the_latest_refusals() -> None:
    log = AdmissionLog(max_events=3)
    for i in range(5):
        log.refused(f"t{i}", "Sample", "tenant has 256 ops in flight; retry")
    assert [e.tenant for e in log.recent()] == ["t2", "t3", "t4"]
