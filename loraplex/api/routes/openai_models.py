"""``GET /v1/models`` (and ``/v1/models/{id}``): what the caller may pass as ``model`` to the
OpenAI-compatible routes: the served base models and the caller's own sampler checkpoints
(``tinker://…/sampler_weights/…``), newest first."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api.auth import Tenant
from loraplex.api.context import ServerContext, ctx_of
from loraplex.errors import NotFoundError

router = APIRouter(prefix="/v1")

PAGE = 500


@router.get("/models")
async def list_models(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx = ctx_of(request)
    data = await asyncio.to_thread(_models, ctx, tenant)
    return {"object": "list", "data": data}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx = ctx_of(request)
    for entry in await asyncio.to_thread(_models, ctx, tenant):
        if entry["id"] == model:
            return entry
    raise NotFoundError(f"model: no model {model!r}", field="model")


def _models(ctx: ServerContext, tenant: str) -> list[dict[str, Any]]:
    out = [{"id": m.name, "object": "model", "created": int(ctx.started_at),
            "owned_by": "loraplex"}
           for m in ctx.catalog]
    offset = 0
    while True:
        records, total = ctx.stores.checkpoints.list_for_tenant(tenant, PAGE, offset)
        out.extend({"id": str(r.path), "object": "model", "created": int(r.created_at),
                    "owned_by": tenant, "root": str(r.path), "parent": r.path.run_id}
                   for r in records if r.path.kind == "sampler_weights")
        offset += len(records)
        if not records or offset >= total:
            return out
