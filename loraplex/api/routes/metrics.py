"""``GET /metrics``: Prometheus text exposition (format 0.0.4) from ``prometheus-client``.

One `SchedulerCollector` per app turns the schedulers' own counters into metric families at
scrape time (nothing is double-counted in a second set of client-library objects): counters
``*_total`` since the server started, gauges for utilization windows and queue depths, and
histograms of queue waits (per class) and op latency (submit → result, per request type); the
client library's process and platform collectors add CPU, memory, file descriptors and the
Python version. Without an operator key (``X-API-Key`` or ``Authorization: Bearer``, which
Prometheus' ``authorization`` scrape setting sends) only the unlabelled machine-wide families
are shown; the per-tenant families (names, ops, tokens, queue depths) need an operator key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from loraplex.api.auth import caller_if_any
from loraplex.api.context import ServerContext
from loraplex.api.lane_views import WINDOWS_S, served_schedulers
from loraplex.domain.usage import TOKEN_TYPES
from loraplex.scheduler.histogram import Histogram
from loraplex.scheduler.scheduler import Scheduler
from loraplex.store.keys import Principal

router = APIRouter()
PREFIX = "loraplex_"
LANE = ["model", "worker"]
"""Every per-scheduler family's first labels: the served model and its engine worker."""


class SchedulerCollector(Collector):
    """Every scheduler's metrics, read when Prometheus scrapes.

    Args:
        with_tenants: include the per-tenant families (operator view).
    """

    def __init__(self, ctx: ServerContext, with_tenants: bool) -> None:
        self._ctx = ctx
        self._with_tenants = with_tenants

    def collect(self) -> Iterator[Metric]:
        families = Families()
        for view in served_schedulers(self._ctx):
            lane = [view.names[0], view.worker]  # the "model", "worker" label values
            _engine(families, view.scheduler, lane)
            if self._with_tenants:
                _tenants(families, view.scheduler, lane)
            _histograms(families, view.scheduler, lane)
        families.gauge("pending_futures", "Futures not completed yet.", []).add_metric(
            [], self._ctx.futures.num_pending())
        yield from families.all()


class Families:
    """Metric families by name, created on first use with their label names."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def counter(self, name: str, help_text: str, labels: list[str]) -> CounterMetricFamily:
        family = self._families.setdefault(name, CounterMetricFamily(PREFIX + name, help_text,
                                                                     labels=labels))
        assert isinstance(family, CounterMetricFamily)
        return family

    def gauge(self, name: str, help_text: str, labels: list[str]) -> GaugeMetricFamily:
        family = self._families.setdefault(name, GaugeMetricFamily(PREFIX + name, help_text,
                                                                   labels=labels))
        assert isinstance(family, GaugeMetricFamily)
        return family

    def histogram(self, name: str, help_text: str, labels: list[str]) -> HistogramMetricFamily:
        family = self._families.setdefault(name, HistogramMetricFamily(
            PREFIX + name, help_text, labels=labels))
        assert isinstance(family, HistogramMetricFamily)
        return family

    def all(self) -> Iterator[Metric]:
        return iter(self._families.values())


@dataclass(frozen=True)
class MetricsRegistries:
    """The app's two registries: the operator's (per-tenant families too) and everyone's."""

    operator: CollectorRegistry
    public: CollectorRegistry


def metrics_registries(ctx: ServerContext) -> MetricsRegistries:
    """The schedulers' collector plus process and platform metrics, in both views."""

    def registry(with_tenants: bool) -> CollectorRegistry:
        out = CollectorRegistry(auto_describe=False)
        for collector in (SchedulerCollector(ctx, with_tenants), PROCESS_COLLECTOR,
                          PLATFORM_COLLECTOR):
            out.register(collector)
        return out

    return MetricsRegistries(operator=registry(True), public=registry(False))


@router.get("/metrics")
async def metrics(request: Request,
                  caller: Annotated[Principal | None, Depends(caller_if_any)]) -> Response:
    registries: MetricsRegistries = request.app.state.metrics_registries
    registry = registries.operator if caller is not None and caller.is_operator else (
        registries.public)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)


def _engine(f: Families, scheduler: Scheduler, lane: list[str]) -> None:
    m = scheduler.metrics
    calls, engine_s, idle_s, overhead_s = m.totals()
    ops, tenant_slots = m.packing()
    by_kind = [*LANE, "kind"]
    for kind, n in calls.items():
        f.counter("engine_calls", "Plans run, by kind.", by_kind).add_metric([*lane, kind], n)
    for kind, s in engine_s.items():
        f.counter("engine_seconds", "Seconds inside the engine, by plan kind.",
                  by_kind).add_metric([*lane, kind], s)
    for kind, n in ops.items():
        f.counter("plan_ops", "Ops carried by plans, by kind.", by_kind).add_metric(
            [*lane, kind], n)
    for kind, n in tenant_slots.items():
        f.counter("plan_tenants", "Distinct tenants per plan, summed.", by_kind).add_metric(
            [*lane, kind], n)
    f.counter("engine_idle_seconds", "Seconds the engine had nothing to do.",
              LANE).add_metric(lane, idle_s)
    f.counter("scheduler_overhead_seconds", "Seconds of scheduler bookkeeping around engine "
              "calls.", LANE).add_metric(lane, overhead_s)
    for window in WINDOWS_S:
        f.gauge("engine_utilization", "Engine-busy fraction of the window.",
                [*LANE, "window"]).add_metric([*lane, f"{window:g}s"], m.utilization(window))
    f.gauge("queued_ops", "Ops waiting or running.", LANE).add_metric(
        lane, scheduler.num_queued())


def _tenants(f: Families, scheduler: Scheduler, lane: list[str]) -> None:
    kind_labels = [*LANE, "tenant", "kind"]
    for tenant, c in scheduler.metrics.tenants_snapshot().items():
        for kind, n in c.ops.items():
            f.counter("tenant_ops", "Finished ops per tenant.", kind_labels).add_metric(
                [*lane, tenant, kind], n)
        for kind, n in c.failed.items():
            f.counter("tenant_failed_ops", "Failed ops per tenant.", kind_labels).add_metric(
                [*lane, tenant, kind], n)
        for kind, n in c.rejected.items():
            f.counter("tenant_rejected", "Submits refused with 429.", kind_labels).add_metric(
                [*lane, tenant, kind], n)
        f.counter("tenant_engine_seconds", "Engine seconds per tenant.",
                  [*LANE, "tenant"]).add_metric([*lane, tenant], c.usage.engine_s)
        for token_type in TOKEN_TYPES:
            f.counter("tenant_tokens", "Tokens per tenant, by type.",
                      [*LANE, "tenant", "type"]).add_metric(
                [*lane, tenant, token_type], getattr(c.usage, f"{token_type}_tokens"))
    for tenant, depth in scheduler.queue_depths().items():
        for queue, n in depth.items():
            f.gauge("tenant_queue_depth", "Ops per tenant and queue.",
                    [*LANE, "tenant", "queue"]).add_metric([*lane, tenant, queue], n)


def _histograms(f: Families, scheduler: Scheduler, lane: list[str]) -> None:
    waits, latencies = scheduler.metrics.histograms()
    for cls, hist in waits.items():
        _observe(f.histogram("queue_wait_seconds", "Seconds an op waited in its queue before "
                             "the engine took it, by class.", [*LANE, "class"]),
                 [*lane, cls], hist)
    for kind, hist in latencies.items():
        _observe(f.histogram("op_latency_seconds", "Seconds from submit to result, by "
                             "request type.", [*LANE, "kind"]), [*lane, kind], hist)


def _observe(family: HistogramMetricFamily, labels: list[str], hist: Histogram) -> None:
    buckets = [("+Inf" if bound == float("inf") else f"{bound:g}", n)
               for bound, n in hist.cumulative()]
    family.add_metric(labels, buckets, hist.total)
