"""The live scheduler lanes as the stats, metrics, trace and dashboard views read them: one
`LaneView` per engine worker of each served model source, its utilization over the standard
windows, and percentiles of queue waits. No routes: the views share it.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.api.context import ServerContext
from loraplex.api.responses.stats import Utilization, WaitPercentiles
from loraplex.scheduler.metrics import SchedulerMetrics
from loraplex.scheduler.scheduler import Scheduler

WINDOWS_S = (10.0, 60.0, 300.0)
"""The utilization windows every view reports (seconds)."""


@dataclass(frozen=True)
class LaneView:
    """One live scheduler (one per engine worker), its worker and the names it serves."""

    scheduler: Scheduler
    worker: str
    names: list[str]


def served_schedulers(ctx: ServerContext) -> list[LaneView]:
    """Every live lane of every served model source."""
    out = []
    for lanes in ctx.catalog.lanes():
        names = [served.name for served in ctx.catalog if served.lanes is lanes]
        out += [LaneView(scheduler, worker, names) for worker, scheduler in lanes.schedulers()]
    return out


def utilization(m: SchedulerMetrics) -> Utilization:
    return {f"{w:g}s": m.utilization(w) for w in WINDOWS_S}


def percentiles(values: list[float]) -> WaitPercentiles:
    if not values:
        return WaitPercentiles(n=0)
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return WaitPercentiles(n=len(ordered), p50=at(0.5), p95=at(0.95), max=ordered[-1])
