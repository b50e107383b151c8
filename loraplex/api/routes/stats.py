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

from fastapi import APIRouter, Request

from loraplex.api.auth import Caller
from loraplex.api.context import ctx_of
from loraplex.api.lane_views import LaneView, percentiles, served_schedulers, utilization
from loraplex.api.responses.stats import (
    CycleRecordView,
    CycleSummary,
    SchedulerStats,
    Stats,
    TenantCounters,
    UtilizationSeries,
    WorkerStats,
)
from loraplex.domain.json_value import JSONObject
from loraplex.errors import WorkerLostError
from loraplex.scheduler.metrics import CycleRecord
from loraplex.scheduler.scheduler import Scheduler

router = APIRouter(prefix="/api/v1")

SERIES_BUCKET_S = 5.0
SERIES_BUCKETS = 60


@router.get("/loraplex/stats", response_model_exclude_unset=True)
async def stats(request: Request, caller: Caller, recent: int = 50) -> Stats:
    ctx = ctx_of(request)
    viewer = None if caller.is_operator else caller.tenant
    views = served_schedulers(ctx)
    sections = [scheduler_stats(v.scheduler, v.names, max(0, min(recent, 4096)), viewer,
                                v.worker) for v in views]
    calls: defaultdict[str, int] = defaultdict(int)
    engine_s: defaultdict[str, float] = defaultdict(float)
    tenants: dict[str, TenantCounters] = {}
    for section in sections:
        for kind, n in section.engine_calls.items():
            calls[kind] += n
        for kind, s in section.engine_s.items():
            engine_s[kind] += s
        for name, counters in section.tenants.items():
            tenants[name] = _merge(tenants.get(name), counters)
    return Stats(
        engine_calls=dict(calls), engine_s=dict(engine_s),
        queued_ops=sum(v.scheduler.num_queued() for v in views),
        pending_futures=ctx.futures.num_pending(),
        utilization=_mean_windows([s.utilization for s in sections]),  # mean engine
        tenants=tenants, workers=[worker_stats(v) for v in views], schedulers=sections)


def worker_stats(view: LaneView) -> WorkerStats:
    """A worker's adapters, their memory and paging, its engine utilization and what decides
    its bits (a worker found dead here is reported as lost, not as a server error)."""
    worker = WorkerStats(worker=view.worker, models=view.names,
                         compute=view.scheduler.executor.model_info().compute,
                         utilization=utilization(view.scheduler.metrics), memory=None)
    try:
        worker.memory = view.scheduler.executor.adapter_memory()
    except WorkerLostError as exc:
        worker.lost = exc.message
    return worker


def worker_json(view: LaneView) -> JSONObject:
    """`worker_stats` as sent."""
    return worker_stats(view).model_dump(mode="json", exclude_unset=True)


def scheduler_stats(scheduler: Scheduler, names: list[str], recent: int,
                    viewer: str | None = None, worker: str = "w0") -> SchedulerStats:
    """One scheduler's section; ``viewer`` (a tenant) sees only its own tenant's ids, None
    (an operator) sees all."""
    m = scheduler.metrics
    records = m.recent(m.capacity)
    calls, engine_s, idle_s, overhead_s = m.totals()
    share = m.share(60.0)
    busy = sum(share.values())
    return SchedulerStats(
        models=names, worker=worker,
        engine_calls=calls, engine_s=engine_s, idle_s=idle_s, overhead_s=overhead_s,
        utilization=utilization(m),
        utilization_series=UtilizationSeries(
            bucket_s=SERIES_BUCKET_S, busy=m.busy_series(SERIES_BUCKET_S, SERIES_BUCKETS)),
        engine_share_60s={kind: s / busy for kind, s in share.items()} if busy else {},
        cycles=cycle_summary(records),
        queue_waits_s={cls: percentiles(v) for cls, v in m.waits().items()},
        tenants={t: v for t, v in tenant_stats(scheduler).items()
                 if viewer is None or t == viewer},
        recent_cycles=([cycle_view(c, viewer) for c in records[-recent:]]
                       if recent else []))


def cycle_summary(records: list[CycleRecord]) -> CycleSummary:
    """What the training cycles in the ring packed, on average."""
    cycles = [c for c in records if c.kind == "cycle"]
    if not cycles:
        return CycleSummary(count=0)
    n = len(cycles)
    return CycleSummary(
        count=n,
        mean_ops=sum(c.num_ops for c in cycles) / n,
        mean_tenants=sum(len(c.tenants) for c in cycles) / n,
        mean_models=sum(c.num_models for c in cycles) / n,
        mean_tokens=sum(c.num_tokens for c in cycles) / n,
        multi_tenant_fraction=sum(len(c.tenants) > 1 for c in cycles) / n,
        mean_engine_s=sum(c.engine_s for c in cycles) / n)


def tenant_stats(scheduler: Scheduler) -> dict[str, TenantCounters]:
    depths = scheduler.queue_depths()
    out: dict[str, TenantCounters] = {}
    for tenant, c in scheduler.metrics.tenants_snapshot().items():
        u = c.usage
        out[tenant] = TenantCounters(
            ops=dict(c.ops), failed=dict(c.failed), rejected=dict(c.rejected),
            engine_s=u.engine_s, trained_tokens=u.trained_tokens,
            forward_tokens=u.forward_tokens, prompt_tokens=u.prompt_tokens,
            cache_hit_tokens=u.cache_hit_tokens, sampled_tokens=u.sampled_tokens,
            queue=depths.get(tenant, {}))
    for tenant, depth in depths.items():
        out.setdefault(tenant, TenantCounters(queue=depth))
    return out


def cycle_view(cycle: CycleRecord, viewer: str | None = None) -> CycleRecordView:
    return CycleRecordView.model_validate(
        {**asdict(cycle), "tenants": [t for t in cycle.tenants if viewer is None or t == viewer],
         "num_tenants": len(cycle.tenants)})


def _merge(into: TenantCounters | None, counters: TenantCounters) -> TenantCounters:
    """One tenant's counters of two lanes, summed (a field either sets is set)."""
    if into is None:
        return counters
    out = into.model_dump(exclude_unset=True)
    for key, value in counters.model_dump(exclude_unset=True).items():
        if isinstance(value, dict):
            merged = dict(out.get(key, {}))
            for k, v in value.items():
                merged[k] = merged.get(k, 0) + v
            out[key] = merged
        else:
            out[key] = out.get(key, 0) + value
    return TenantCounters.model_validate(out)


def _mean_windows(sections: list[dict[str, float]]) -> dict[str, float]:
    if not sections:
        return {}
    return {k: sum(s[k] for s in sections) / len(sections) for k in sections[0]}
