"""``GET /api/v1/loraplex/usage``: the calling tenant's metered usage, priced.

Own tenant only: totals and a per-training-run breakdown (samples of the bare base model under
``run_id: null``), token counts, engine seconds per op kind, and the bill in both billing modes
(``per_rollout``, ``cache_aware``; `loraplex.cost.billing`). Pending metered ops are
flushed first, so an op's usage shows as soon as its future completes. ``since`` (Unix
seconds) limits it to the hours from then on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api import metering
from loraplex.api.auth import Tenant
from loraplex.api.context import ctx_of
from loraplex.cost.billing import Biller

router = APIRouter(prefix="/api/v1")


@router.get("/loraplex/usage")
async def usage(request: Request, tenant: Tenant, since: float | None = None
                ) -> dict[str, Any]:
    ctx = ctx_of(request)
    biller = Biller(ctx.config.metering)
    await asyncio.to_thread(metering.flush, ctx)
    rows = await asyncio.to_thread(ctx.stores.usage.rows, tenant, since)
    found = biller.tenants(rows)
    report = found[0] if found else None
    empty = biller.summarize(None, [])
    return {
        "tenant": tenant,
        "price_sheet": biller.sheet_json(),
        "totals": (report.totals if report else empty).to_json(),
        "runs": [r.to_json() for r in report.runs] if report else [],
        "notes": ["storage is not metered (billed at 0)"],
    }
