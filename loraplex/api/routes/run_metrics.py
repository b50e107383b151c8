"""``GET /api/v1/loraplex/training_runs/{model_id}/metrics``: a run's curves, per step.

Owner only (another tenant's run is a 404). Both series of `loraplex.store.run_metrics`
(``train``: one point per optim step; ``forward``: forward-only evaluations), each the closed
steps after ``after_step`` in at most ``max_points`` buckets: every step while they fit, else
each point the mean of ``bucket`` consecutive steps with the bucket's min and max beside it, so
a 100,000-step run costs the page no more than a 2,000-step one. The step still waiting for its
optim_step is ``open_step``. Logged points are flushed to the store first.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from loraplex.api import metering
from loraplex.api.auth import Tenant
from loraplex.api.context import ctx_of
from loraplex.api.responses.run_metrics import OpenStep, RunMetrics, StepSeriesView
from loraplex.errors import user_error
from loraplex.store.run_metrics import StepSeries

router = APIRouter(prefix="/api/v1")
MAX_POINTS = 10_000
MAX_STEP = 2**62  # SQLite integers are 64-bit


@router.get("/loraplex/training_runs/{model_id}/metrics", response_model_exclude_unset=True)
async def run_metrics(model_id: str, request: Request, tenant: Tenant, max_points: int = 2000,
                      after_step: int = 0) -> RunMetrics:
    if not 1 <= max_points <= MAX_POINTS:
        raise user_error("max_points", f"must be in [1, {MAX_POINTS}], got {max_points}")
    if not 0 <= after_step <= MAX_STEP:
        raise user_error("after_step", f"must be in [0, {MAX_STEP}], got {after_step}")
    ctx = ctx_of(request)
    record = ctx.stores.runs.get(model_id, tenant)
    await asyncio.to_thread(metering.flush_steps, ctx)
    store = ctx.stores.run_metrics

    def read() -> tuple[StepSeries, StepSeries]:
        return (store.series(model_id, "train", max_points=max_points, after_step=after_step),
                store.series(model_id, "forward", max_points=max_points,
                             after_step=after_step))

    train, forward = await asyncio.to_thread(read)
    return RunMetrics(model_id=model_id, num_steps=record.num_steps,
                      num_trained_tokens=record.num_trained_tokens, after_step=after_step,
                      train=series_view(train), forward=series_view(forward))


def series_view(s: StepSeries) -> StepSeriesView:
    out = StepSeriesView(
        num_steps=s.num_steps, bucket=s.bucket, step=s.steps, count=s.counts, time=s.times,
        tokens=s.tokens, metrics=s.metrics,
        open_step=None if s.open_step is None else OpenStep(step=s.open_step[0],
                                                             metrics=s.open_step[1]))
    if s.bucket > 1:
        out.min, out.max = s.lows, s.highs
    return out
