"""``GET /metrics``: Prometheus text exposition (format 0.0.4) from ``prometheus-client``.

One `SchedulerCollector` per app turns the schedulers' own counters into metric families at
scrape time (nothing is double-counted in a second set of client-library objects): counters
``*_total`` since the server started, gauges for utilization windows and queue depths, and
histograms of queue waits (per class) and op latency (submit → result, per request type); the
client library's process and platform collectors add CPU, memory, file descriptors and the
Python version. Unauthenticated, like every Prometheus endpoint; it names tenants, so expose the
port only where the operator's scraper runs.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request
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

from loraplex.api.context import ServerContext
from loraplex.api.routes.stats import WINDOWS_S, served_schedulers
from loraplex.domain.usage import TOKEN_TYPES
from loraplex.scheduler.histogram import Histogram
from loraplex.scheduler.scheduler import Scheduler

router = APIRouter()
PREFIX = "loraplex_"


class SchedulerCollector(Collector):
    """Every scheduler's metrics, read when Prometheus scrapes."""

    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx

    def collect(self) -> Iterator[Metric]:
        families = Families()
        for scheduler, names in served_schedulers(self._ctx):
            _engine(families, scheduler, names[0])
            _tenants(families, scheduler, names[0])
            _histograms(families, scheduler, names[0])
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


def metrics_registry(ctx: ServerContext) -> CollectorRegistry:
    """The app's registry: the schedulers' collector plus process and platform metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(ctx))
    registry.register(PROCESS_COLLECTOR)
    registry.register(PLATFORM_COLLECTOR)
    return registry


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)


def _engine(f: Families, scheduler: Scheduler, model: str) -> None:
    m = scheduler.metrics
    calls, engine_s, idle_s, overhead_s = m.totals()
    ops, tenant_slots = m.packing()
    by_kind = ["model", "kind"]
    for kind, n in calls.items():
        f.counter("engine_calls", "Plans run, by kind.", by_kind).add_metric([model, kind], n)
    for kind, s in engine_s.items():
        f.counter("engine_seconds", "Seconds inside the engine, by plan kind.",
                  by_kind).add_metric([model, kind], s)
    for kind, n in ops.items():
        f.counter("plan_ops", "Ops carried by plans, by kind.", by_kind).add_metric(
            [model, kind], n)
    for kind, n in tenant_slots.items():
        f.counter("plan_tenants", "Distinct tenants per plan, summed.", by_kind).add_metric(
            [model, kind], n)
    f.counter("engine_idle_seconds", "Seconds the engine had nothing to do.",
              ["model"]).add_metric([model], idle_s)
    f.counter("scheduler_overhead_seconds", "Seconds of scheduler bookkeeping around engine "
              "calls.", ["model"]).add_metric([model], overhead_s)
    for window in WINDOWS_S:
        f.gauge("engine_utilization", "Engine-busy fraction of the window.",
                ["model", "window"]).add_metric([model, f"{window:g}s"], m.utilization(window))
    f.gauge("queued_ops", "Ops waiting or running.", ["model"]).add_metric(
        [model], scheduler.num_queued())


def _tenants(f: Families, scheduler: Scheduler, model: str) -> None:
    kind_labels = ["model", "tenant", "kind"]
    for tenant, c in scheduler.metrics.tenants_snapshot().items():
        for kind, n in c.ops.items():
            f.counter("tenant_ops", "Finished ops per tenant.", kind_labels).add_metric(
                [model, tenant, kind], n)
        for kind, n in c.failed.items():
            f.counter("tenant_failed_ops", "Failed ops per tenant.", kind_labels).add_metric(
                [model, tenant, kind], n)
        for kind, n in c.rejected.items():
            f.counter("tenant_rejected", "Submits refused with 429.", kind_labels).add_metric(
                [model, tenant, kind], n)
        f.counter("tenant_engine_seconds", "Engine seconds per tenant.",
                  ["model", "tenant"]).add_metric([model, tenant], c.usage.engine_s)
        for token_type in TOKEN_TYPES:
            f.counter("tenant_tokens", "Tokens per tenant, by type.",
                      ["model", "tenant", "type"]).add_metric(
                [model, tenant, token_type], getattr(c.usage, f"{token_type}_tokens"))
    for tenant, depth in scheduler.queue_depths().items():
        for queue, n in depth.items():
            f.gauge("tenant_queue_depth", "Ops per tenant and queue.",
                    ["model", "tenant", "queue"]).add_metric([model, tenant, queue], n)


def _histograms(f: Families, scheduler: Scheduler, model: str) -> None:
    waits, latencies = scheduler.metrics.histograms()
    for cls, hist in waits.items():
        _observe(f.histogram("queue_wait_seconds", "Seconds an op waited in its queue before "
                             "the engine took it, by class.", ["model", "class"]),
                 [model, cls], hist)
    for kind, hist in latencies.items():
        _observe(f.histogram("op_latency_seconds", "Seconds from submit to result, by "
                             "request type.", ["model", "kind"]), [model, kind], hist)


def _observe(family: HistogramMetricFamily, labels: list[str], hist: Histogram) -> None:
    buckets = [("+Inf" if bound == float("inf") else f"{bound:g}", n)
               for bound, n in hist.cumulative()]
    family.add_metric(labels, buckets, hist.total)
