"""``GET /api/v1/loraplex/usage``: the calling tenant's metered usage, priced.

Own tenant only: totals and a per-training-run breakdown (samples of the bare base model under
``run_id: null``), token counts, engine seconds per op kind, and the bill in both billing modes
(``per_rollout``, ``cache_aware``; `loraplex.cost.billing`). Pending metered ops are
flushed first, so an op's usage shows as soon as its future completes. ``since`` (Unix
seconds) limits it to the hours from then on. ``quotas`` shows each per-tenant quota's use.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from loraplex.api import convert, metering
from loraplex.api.auth import Tenant
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.responses.usage import PriceSheetView, QuotaUse, UsageSummaryView, UsageView
from loraplex.cost.billing import Biller

router = APIRouter(prefix="/api/v1")


@router.get("/loraplex/usage", response_model_exclude_unset=True)
async def usage(request: Request, tenant: Tenant, since: float | None = None) -> UsageView:
    ctx = ctx_of(request)
    since = convert.unix_time(since, "since")
    biller = Biller(ctx.config.metering, {m.name: m.info.card.active_params
                                          for m in ctx.catalog if m.info.card.moe is not None})
    await asyncio.to_thread(metering.flush, ctx)
    rows = await asyncio.to_thread(ctx.stores.usage.rows, tenant, since)
    found = biller.tenants(rows)
    report = found[0] if found else None
    empty = biller.summarize(None, [])
    return UsageView(
        tenant=tenant, price_sheet=PriceSheetView.model_validate(biller.sheet_json()),
        totals=UsageSummaryView.model_validate((report.totals if report else empty).to_json()),
        runs=[UsageSummaryView.model_validate(r.to_json()) for r in report.runs]
        if report else [],
        quotas=quota_use(ctx, tenant), notes=["storage is not metered (billed at 0)"])


def quota_use(ctx: ServerContext, tenant: str) -> dict[str, QuotaUse]:
    """Each per-tenant quota (`QuotaConfig`, and the scheduler's in-flight limit): used, limit."""
    quotas = ctx.config.quotas
    schedulers = [s for lanes in ctx.catalog.lanes() for _, s in lanes.schedulers()]
    inflight = sum(s.queue_depths().get(tenant, {}).get("inflight", 0) for s in schedulers)
    return {
        "training_runs": QuotaUse(used=sum(s.num_models(tenant) for s in schedulers),
                                  limit=quotas.max_training_runs),
        "checkpoint_bytes": QuotaUse(used=ctx.stores.checkpoints.bytes_for_tenant(tenant),
                                     limit=quotas.max_checkpoint_bytes),
        "inflight_ops": QuotaUse(
            used=inflight, limit=min(s.config.max_inflight_per_tenant for s in schedulers)),
        "unfetched_result_bytes": QuotaUse(used=ctx.futures.unfetched_bytes(tenant),
                                           limit=quotas.max_unfetched_result_bytes),
    }
