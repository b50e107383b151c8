"""``GET /api/v1/loraplex/stats`` as sent: the engine workers, each scheduler lane's section
(totals, utilization, a summary and the last records of its clock cycles, queue waits,
per-tenant counters), and totals over every lane. Queue-wait percentiles are shared with the
operator view."""

from __future__ import annotations

from pydantic import BaseModel, Field

from loraplex.domain.results import AdapterMemory

Utilization = dict[str, float]
"""Engine-busy fraction per window (``10s``, ``60s``, ``300s``: `api.lane_views.WINDOWS_S`)."""


class WaitPercentiles(BaseModel):
    """Queue waits in seconds; only ``n`` when there are none."""

    n: int
    p50: float | None = None
    p95: float | None = None
    max: float | None = None


class TenantCounters(BaseModel):
    """One tenant's ops and usage since start and its queue depths (only ``queue`` for a
    tenant with queued ops and no finished one yet)."""

    ops: dict[str, int] | None = None
    failed: dict[str, int] | None = None
    rejected: dict[str, int] | None = None
    engine_s: float | None = None
    trained_tokens: int | None = None
    forward_tokens: int | None = None
    prompt_tokens: int | None = None
    cache_hit_tokens: int | None = None
    sampled_tokens: int | None = None
    queue: dict[str, int]


class CycleSummary(BaseModel):
    """Means over the training cycles in the ring (only ``count`` when there are none)."""

    count: int
    mean_ops: float | None = None
    mean_tenants: float | None = None
    mean_models: float | None = None
    mean_tokens: float | None = None
    multi_tenant_fraction: float | None = None
    mean_engine_s: float | None = None


class CycleRecordView(BaseModel):
    """One `scheduler.metrics.CycleRecord`, ``tenants`` cut to what the viewer may see and
    ``num_tenants`` how many it carried."""

    index: int
    kind: str
    started_at: float
    wall_time: float
    engine_s: float
    train_s: float
    optim_s: float
    io_s: float
    idle_s: float
    overhead_s: float
    tenants: list[str]
    num_models: int
    num_ops: int
    num_tokens: int
    num_running: int
    max_wait_s: float
    num_tenants: int


class UtilizationSeries(BaseModel):
    bucket_s: float
    busy: list[float] = Field(description="engine-busy fraction per bucket, oldest first")


class SchedulerStats(BaseModel):
    """One lane: the scheduler of one engine worker of a loaded model."""

    models: list[str]
    worker: str
    engine_calls: dict[str, int] = Field(description="plans run per kind since start")
    engine_s: dict[str, float]
    idle_s: float
    overhead_s: float
    utilization: Utilization
    utilization_series: UtilizationSeries
    engine_share_60s: dict[str, float]
    cycles: CycleSummary
    queue_waits_s: dict[str, WaitPercentiles]
    tenants: dict[str, TenantCounters]
    recent_cycles: list[CycleRecordView]


class WorkerStats(BaseModel):
    """An engine worker: its adapters' memory (null, with ``lost``, for a dead worker)."""

    worker: str
    models: list[str]
    compute: str = Field(description="what decides the bits of its logprobs")
    utilization: Utilization
    memory: AdapterMemory | None
    lost: str | None = None


class Stats(BaseModel):
    engine_calls: dict[str, int]
    engine_s: dict[str, float]
    queued_ops: int
    pending_futures: int
    utilization: Utilization = Field(description="the mean over the lanes")
    tenants: dict[str, TenantCounters]
    workers: list[WorkerStats]
    schedulers: list[SchedulerStats]
