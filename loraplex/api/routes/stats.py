"""``GET /api/v1/loraplex/stats``: server-wide scheduling totals (no tenant breakdown).

A minimal view of the schedulers' cycle records: engine calls and engine seconds per plan kind,
plus what is queued now. The overhead benchmark reads engine time here; issue 5's utilization
and Prometheus views will grow from the same records.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api.auth import Tenant
from loraplex.api.context import ctx_of

router = APIRouter(prefix="/api/v1")


@router.get("/loraplex/stats")
async def stats(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx = ctx_of(request)
    calls: dict[str, int] = defaultdict(int)
    engine_s: dict[str, float] = defaultdict(float)
    queued = 0
    for scheduler in ctx.catalog.schedulers():
        for cycle in scheduler.usage.recent_cycles(n=1_000_000):
            calls[cycle.plan] += 1
            engine_s[cycle.plan] += cycle.engine_s
        queued += scheduler.num_queued()
    return {"engine_calls": dict(calls), "engine_s": dict(engine_s), "queued_ops": queued,
            "pending_futures": ctx.futures.num_pending()}
