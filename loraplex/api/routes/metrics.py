"""``GET /metrics``: Prometheus text exposition (format 0.0.4) of the schedulers' counters.

Written by hand (no client library): counters ``*_total`` since the server started, gauges for
utilization windows and queue depths. Unauthenticated, like every Prometheus endpoint; it names
tenants, so expose the port only where the operator's scraper runs.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from loraplex.api.context import ctx_of
from loraplex.api.routes.stats import WINDOWS_S, served_schedulers
from loraplex.scheduler.scheduler import Scheduler

router = APIRouter()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TOKEN_TYPES = ("trained", "forward", "prompt", "cache_hit", "sampled")


class Exposition:
    """Accumulates metric families; one HELP/TYPE header per family."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, metric_type: str, help_text: str, value: float,
            **labels: str) -> None:
        family = self._families.setdefault(f"loraplex_{name}", (metric_type, help_text, []))
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        family[2].append(f"loraplex_{name}{{{body}}} {value!r}" if body
                         else f"loraplex_{name} {value!r}")

    def text(self) -> str:
        lines = []
        for name, (metric_type, help_text, samples) in self._families.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {metric_type}", *samples]
        return "\n".join(lines) + "\n"


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    ctx = ctx_of(request)
    out = Exposition()
    for scheduler, names in served_schedulers(ctx):
        _scheduler_metrics(out, scheduler, names[0])
    out.add("pending_futures", "gauge", "Futures not completed yet.", ctx.futures.num_pending())
    return PlainTextResponse(out.text(), media_type=CONTENT_TYPE)


def _scheduler_metrics(out: Exposition, scheduler: Scheduler, model: str) -> None:
    m = scheduler.metrics
    calls, engine_s, idle_s, overhead_s = m.totals()
    ops, tenant_slots = m.packing()
    for kind, n in calls.items():
        out.add("engine_calls_total", "counter", "Plans run, by kind.", n, model=model,
                kind=kind)
    for kind, s in engine_s.items():
        out.add("engine_seconds_total", "counter", "Seconds inside the engine, by plan kind.",
                s, model=model, kind=kind)
    for kind, n in ops.items():
        out.add("plan_ops_total", "counter", "Ops carried by plans, by kind.", n, model=model,
                kind=kind)
    for kind, n in tenant_slots.items():
        out.add("plan_tenants_total", "counter", "Distinct tenants per plan, summed.", n,
                model=model, kind=kind)
    out.add("engine_idle_seconds_total", "counter", "Seconds the engine had nothing to do.",
            idle_s, model=model)
    out.add("scheduler_overhead_seconds_total", "counter",
            "Seconds of scheduler bookkeeping around engine calls.", overhead_s, model=model)
    for window in WINDOWS_S:
        out.add("engine_utilization", "gauge", "Engine-busy fraction of the window.",
                m.utilization(window), model=model, window=f"{window:g}s")
    out.add("queued_ops", "gauge", "Ops waiting or running.", scheduler.num_queued(),
            model=model)
    _tenant_metrics(out, scheduler, model)


def _tenant_metrics(out: Exposition, scheduler: Scheduler, model: str) -> None:
    for tenant, c in scheduler.metrics.tenants_snapshot().items():
        for kind, n in c.ops.items():
            out.add("tenant_ops_total", "counter", "Finished ops per tenant.", n, model=model,
                    tenant=tenant, kind=kind)
        for kind, n in c.failed.items():
            out.add("tenant_failed_ops_total", "counter", "Failed ops per tenant.", n,
                    model=model, tenant=tenant, kind=kind)
        for kind, n in c.rejected.items():
            out.add("tenant_rejected_total", "counter", "Submits refused with 429.", n,
                    model=model, tenant=tenant, kind=kind)
        out.add("tenant_engine_seconds_total", "counter", "Engine seconds per tenant.",
                c.engine_s, model=model, tenant=tenant)
        for token_type in TOKEN_TYPES:
            out.add("tenant_tokens_total", "counter", "Tokens per tenant, by type.",
                    getattr(c, f"{token_type}_tokens"), model=model, tenant=tenant,
                    type=token_type)
    for tenant, depth in scheduler.queue_depths().items():
        for queue, n in depth.items():
            out.add("tenant_queue_depth", "gauge", "Ops per tenant and queue.", n, model=model,
                    tenant=tenant, queue=queue)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
