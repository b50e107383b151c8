"""The trace export's event layout on hand-made records: IO work that overlaps spreads over as
many IO tracks as it needs, a slice the wall clock started a hair before its predecessor ended
is moved up to it (complete events on one track must not overlap), refused submits become
instant events, and a tenant sees only its own id."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from loraplex.api.cycle_view import LaneCycles
from loraplex.api.lane_views import LaneView
from loraplex.api.routes.trace import TRACKS, lane_events
from loraplex.scheduler.metrics import CycleRecord, SchedulerMetrics


@dataclass
class MetricsOnly:
    """The part of a scheduler the trace reads."""

    metrics: SchedulerMetrics


def rec(kind: str, start: float, engine_s: float = 0.0, io_s: float = 0.0,
        tenants: tuple[str, ...] = ("alice",)) -> CycleRecord:
    return CycleRecord(index=0, kind=kind, started_at=start, wall_time=start,
                       engine_s=engine_s, io_s=io_s, tenants=tenants)


def events(records: list[CycleRecord], viewer: str | None) -> list[dict[str, Any]]:
    metrics = SchedulerMetrics()
    metrics.rejected("bob", "Sample", "tenant has 3 ops in flight; retry")
    metrics.rejected("alice", "ForwardBackward", "over the limit")
    view = LaneView(MetricsOnly(metrics), "w0", ["m"])  # type: ignore[arg-type]
    return lane_events(1, LaneCycles("m/w0", view, 100, records), viewer)


def test_overlapping_io_gets_its_own_tracks_and_clock_slices_never_overlap() -> None:
    out = events([rec("cycle", 100.0, engine_s=0.5, tenants=("alice", "bob")),
                  rec("cycle", 100.499, engine_s=0.1),  # starts 1 ms early
                  rec("control", 100.2, engine_s=0.1),  # its own track: left as it is
                  rec("io", 100.0, io_s=2.0), rec("io", 100.5, io_s=1.0),
                  rec("io", 102.5, io_s=0.1),
                  rec("sample", 101.0, engine_s=0.2)], viewer=None)
    first, second = sorted((e for e in out if e["name"] == "cycle"), key=lambda e: e["ts"])
    assert second["ts"] == pytest.approx(first["ts"] + first["dur"])  # moved up by 1 ms
    assert second["dur"] == pytest.approx(0.099e6) and second["tid"] == TRACKS["training"]
    control = next(e for e in out if e["name"] == "control")
    assert control["ts"] == pytest.approx(100.2e6) and control["tid"] == TRACKS["control"]
    io = sorted((e for e in out if e["name"] == "io"), key=lambda e: e["ts"])
    assert [e["tid"] for e in io] == [10, 11, 10]  # the second overlapped the first
    names = {(e["tid"]): e["args"]["name"] for e in out if e["name"] == "thread_name"}
    assert names[10] == "io 1" and names[11] == "io 2" and names[1] == "training"
    assert first["args"]["tenants"] == ["alice", "bob"] and first["dur"] == 0.5e6
    counter = next(e for e in out if e["ph"] == "C")
    assert counter["name"] == "decode batch" and counter["ts"] == 101e6
    refused = [e for e in out if e["ph"] == "i"]
    assert [e["args"]["tenant"] for e in refused] == ["bob", "alice"]


def test_a_tenant_sees_its_own_id_and_its_own_refusals_only() -> None:
    out = events([rec("cycle", 100.0, engine_s=0.5, tenants=("alice", "bob"))], "alice")
    cycle = next(e for e in out if e["name"] == "cycle")
    assert cycle["args"]["tenants"] == ["alice"] and cycle["args"]["num_tenants"] == 2
    assert [e["args"]["tenant"] for e in out if e["ph"] == "i"] == ["alice"]
    assert "bob" not in str(out)
