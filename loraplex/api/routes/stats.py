"""``GET /api/v1/loraplex/stats``: how the schedulers are doing, as JSON.

An operator key sees everything, every tenant by name. Any other key sees the machine-wide
figures only as aggregates: its own tenant's counters, and in each cycle record its own id
(when it took part) plus how many tenants shared the cycle, never another tenant's id.

Top level: the engine workers (adapters resident and paged, their memory, utilization), totals
over every scheduler (``engine_calls`` / ``engine_s`` per plan kind since
start, utilization windows, queue waits, per-tenant counters and queue depths).
``schedulers`` has the same per lane (one per engine worker of a loaded model) plus a summary
of its recent clock cycles and the last ``recent`` cycle records (query parameter, default 50).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api.auth import Caller
from loraplex.api.context import ctx_of
from loraplex.api.lane_views import LaneView, percentiles, served_schedulers, utilization
from loraplex.domain.usage import TOKEN_TYPES
from loraplex.errors import WorkerLostError
from loraplex.scheduler.metrics import CycleRecord
from loraplex.scheduler.scheduler import Scheduler

router = APIRouter(prefix="/api/v1")

SERIES_BUCKET_S = 5.0
SERIES_BUCKETS = 60


@router.get("/loraplex/stats")
async def stats(request: Request, caller: Caller, recent: int = 50) -> dict[str, Any]:
    ctx = ctx_of(request)
    viewer = None if caller.is_operator else caller.tenant
    views = served_schedulers(ctx)
    sections = [scheduler_stats(v.scheduler, v.names, max(0, min(recent, 4096)), viewer,
                                v.worker) for v in views]
    calls: defaultdict[str, int] = defaultdict(int)
    engine_s: defaultdict[str, float] = defaultdict(float)
    tenants: dict[str, dict[str, Any]] = {}
    for section in sections:
        for kind, n in section["engine_calls"].items():
            calls[kind] += n
        for kind, s in section["engine_s"].items():
            engine_s[kind] += s
        for name, counters in section["tenants"].items():
            tenants[name] = _merge(tenants.get(name), counters)
    return {
        "engine_calls": dict(calls), "engine_s": dict(engine_s),
        "queued_ops": sum(v.scheduler.num_queued() for v in views),
        "pending_futures": ctx.futures.num_pending(),
        "utilization": _mean_windows([s["utilization"] for s in sections]),  # mean engine
        "tenants": tenants, "workers": [worker_json(v) for v in views],
        "schedulers": sections,
    }


def worker_json(view: LaneView) -> dict[str, Any]:
    """A worker's adapters, their memory and paging, its engine utilization and what decides
    its bits (a worker found dead here is reported as lost, not as a server error)."""
    out: dict[str, Any] = {"worker": view.worker, "models": view.names,
                           "compute": view.scheduler.executor.model_info().compute,
                           "utilization": utilization(view.scheduler.metrics)}
    try:
        out["memory"] = asdict(view.scheduler.executor.adapter_memory())
    except WorkerLostError as exc:
        out["memory"], out["lost"] = None, exc.message
    return out


def scheduler_stats(scheduler: Scheduler, names: list[str], recent: int,
                    viewer: str | None = None, worker: str = "w0") -> dict[str, Any]:
    """One scheduler's section; ``viewer`` (a tenant) sees only its own tenant's ids, None
    (an operator) sees all."""
    m = scheduler.metrics
    records = m.recent(m.capacity)
    calls, engine_s, idle_s, overhead_s = m.totals()
    share = m.share(60.0)
    busy = sum(share.values())
    return {
        "models": names, "worker": worker,
        "engine_calls": calls, "engine_s": engine_s, "idle_s": idle_s, "overhead_s": overhead_s,
        "utilization": utilization(m),
        "utilization_series": {"bucket_s": SERIES_BUCKET_S,
                               "busy": m.busy_series(SERIES_BUCKET_S, SERIES_BUCKETS)},
        "engine_share_60s": {kind: s / busy for kind, s in share.items()} if busy else {},
        "cycles": cycle_summary(records),
        "queue_waits_s": {cls: percentiles(v) for cls, v in m.waits().items()},
        "tenants": {t: v for t, v in tenant_stats(scheduler).items()
                    if viewer is None or t == viewer},
        "recent_cycles": ([cycle_json(c, viewer) for c in records[-recent:]]
                          if recent else []),
    }


def cycle_summary(records: list[CycleRecord]) -> dict[str, Any]:
    """What the training cycles in the ring packed, on average."""
    cycles = [c for c in records if c.kind == "cycle"]
    if not cycles:
        return {"count": 0}
    n = len(cycles)
    return {
        "count": n,
        "mean_ops": sum(c.num_ops for c in cycles) / n,
        "mean_tenants": sum(len(c.tenants) for c in cycles) / n,
        "mean_models": sum(c.num_models for c in cycles) / n,
        "mean_tokens": sum(c.num_tokens for c in cycles) / n,
        "multi_tenant_fraction": sum(len(c.tenants) > 1 for c in cycles) / n,
        "mean_engine_s": sum(c.engine_s for c in cycles) / n,
    }


def tenant_stats(scheduler: Scheduler) -> dict[str, dict[str, Any]]:
    depths = scheduler.queue_depths()
    out: dict[str, dict[str, Any]] = {}
    for tenant, c in scheduler.metrics.tenants_snapshot().items():
        out[tenant] = {
            "ops": dict(c.ops), "failed": dict(c.failed), "rejected": dict(c.rejected),
            "engine_s": c.usage.engine_s,
            **{f"{t}_tokens": getattr(c.usage, f"{t}_tokens") for t in TOKEN_TYPES},
            "queue": depths.get(tenant, {}),
        }
    for tenant, depth in depths.items():
        out.setdefault(tenant, {"queue": depth})
    return out


def cycle_json(cycle: CycleRecord, viewer: str | None = None) -> dict[str, Any]:
    out = asdict(cycle)
    out["tenants"] = [t for t in cycle.tenants if viewer is None or t == viewer]
    out["num_tenants"] = len(cycle.tenants)
    return out


def _merge(into: dict[str, Any] | None, counters: dict[str, Any]) -> dict[str, Any]:
    if into is None:
        return counters
    out = dict(into)
    for key, value in counters.items():
        if isinstance(value, dict):
            merged = dict(out.get(key, {}))
            for k, v in value.items():
                merged[k] = merged.get(k, 0) + v
            out[key] = merged
        else:
            out[key] = out.get(key, 0) + value
    return out


def _mean_windows(sections: list[dict[str, float]]) -> dict[str, float]:
    if not sections:
        return {}
    return {k: sum(s[k] for s in sections) / len(sections) for k in sections[0]}
