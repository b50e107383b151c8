"""``GET /api/v1/loraplex/dashboard/operator``: what the operator's view adds to
``/api/v1/loraplex/stats`` (which it also reads): queue waits per tenant (p50 / p95 over the
recent waits of every lane), the latest refused submits (admission and backpressure events),
and every tenant's metered usage priced in both billing modes. Operator keys only (403).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from fastapi import APIRouter, Request

from loraplex.api import metering
from loraplex.api.auth import Caller
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.cycle_view import lane_id
from loraplex.api.lane_views import percentiles, served_schedulers
from loraplex.api.responses.operator_view import (
    AdmissionEventView,
    Admissions,
    OperatorUsage,
    OperatorView,
    TenantUsageView,
)
from loraplex.api.responses.stats import WaitPercentiles
from loraplex.api.responses.usage import PriceSheetView, UsageSummaryView
from loraplex.cost.billing import Biller
from loraplex.errors import ForbiddenError

router = APIRouter(prefix="/api/v1")
MAX_EVENTS = 200


@router.get("/loraplex/dashboard/operator", response_model_exclude_unset=True)
async def operator_view(request: Request, caller: Caller) -> OperatorView:
    if not caller.is_operator:
        raise ForbiddenError("the operator view needs an operator key (loraplex keys create "
                             "NAME --operator)")
    ctx = ctx_of(request)
    await asyncio.to_thread(metering.flush, ctx)
    rows = await asyncio.to_thread(ctx.stores.usage.rows)
    biller = Biller(ctx.config.metering)
    return OperatorView(
        queue_waits_s=tenant_waits(ctx), admissions=admissions(ctx),
        usage=OperatorUsage(
            price_sheet=PriceSheetView.model_validate(biller.sheet_json()),
            tenants=[TenantUsageView(tenant=t.tenant,
                                     totals=UsageSummaryView.model_validate(t.totals.to_json()))
                     for t in biller.tenants(rows)]))


def tenant_waits(ctx: ServerContext) -> dict[str, dict[str, WaitPercentiles]]:
    """Per tenant and class: percentiles of the recent waits over every lane."""
    merged: defaultdict[str, defaultdict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    for view in served_schedulers(ctx):
        for tenant, by_class in view.scheduler.metrics.tenant_waits.snapshot().items():
            for cls, values in by_class.items():
                merged[tenant][cls] += values
    return {t: {cls: percentiles(v) for cls, v in by_class.items()}
            for t, by_class in sorted(merged.items())}


def admissions(ctx: ServerContext) -> Admissions:
    """The newest refused submits over every lane (oldest first) and per-tenant totals."""
    events: list[AdmissionEventView] = []
    totals: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for view in served_schedulers(ctx):
        for event in view.scheduler.metrics.admissions.recent():
            events.append(AdmissionEventView(time=event.wall_time, tenant=event.tenant,
                                             kind=event.kind, reason=event.reason,
                                             lane=lane_id(view)))
        for tenant, counters in view.scheduler.metrics.tenants_snapshot().items():
            for kind, n in counters.rejected.items():
                totals[tenant][kind] += n
    events.sort(key=lambda e: e.time)
    return Admissions(events=events[-MAX_EVENTS:],
                      rejected={t: dict(k) for t, k in sorted(totals.items())})
