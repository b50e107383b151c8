"""REST views of training runs and their checkpoints: list/get runs, list/delete/publish/
unpublish/ttl checkpoints, the user-wide checkpoint list (tinker-api.md §5, §5.6).

A checkpoint id is ``{kind}/{name}``, so routes take it as two path segments. Owners see and
change everything of theirs; other tenants see only published checkpoints (and the runs that
have one, with ``access_scope=accessible``).
"""

from __future__ import annotations

import datetime

from fastapi import APIRouter, Request, Response

from loraplex.api import convert, schemas
from loraplex.api.access import forget_checkpoint, owned_checkpoint
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.responses.training_runs import (
    Checkpoint,
    CheckpointsListResponse,
    Cursor,
    TrainingRun,
    TrainingRunsResponse,
)
from loraplex.errors import NotFoundError
from loraplex.store.checkpoints import CheckpointRecord
from loraplex.store.runs import TrainingRunRecord

router = APIRouter(prefix="/api/v1")


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def checkpoint_view(c: CheckpointRecord) -> Checkpoint:
    out = Checkpoint(
        checkpoint_id=c.path.checkpoint_id, checkpoint_type=c.path.checkpoint_type,
        time=iso(c.created_at), tinker_path=str(c.path), size_bytes=c.size_bytes,
        public=c.public, training_run_id=c.path.run_id)
    if c.user_metadata:
        out.user_metadata = dict(c.user_metadata)
    if c.expires_at is not None:
        out.expires_at = iso(c.expires_at)
    return out


def run_view(ctx: ServerContext, record: TrainingRunRecord, tenant: str) -> TrainingRun:
    run = record.run
    visible = [c for c in ctx.stores.checkpoints.list_for_run(run.model_id)
               if c.readable_by(tenant)]
    latest = {kind: max((c for c in visible if c.path.kind == kind),
                        key=lambda c: c.created_at, default=None)
              for kind in ("weights", "sampler_weights")}
    out = TrainingRun(
        training_run_id=run.model_id, base_model=run.base_model, model_owner=run.tenant,
        is_lora=True, corrupted=False, lora_rank=run.lora.rank,
        last_request_time=iso(record.last_request_time),
        user_metadata={str(k): str(v) for k, v in run.user_metadata.items()})
    if latest["weights"] is not None:
        out.last_checkpoint = checkpoint_view(latest["weights"])
    if latest["sampler_weights"] is not None:
        out.last_sampler_checkpoint = checkpoint_view(latest["sampler_weights"])
    return out


def _visible_run(ctx: ServerContext, run_id: str, tenant: str, accessible: bool
                 ) -> TrainingRunRecord:
    run = ctx.stores.runs.find(run_id)
    if run is not None and (run.run.tenant == tenant or (accessible and any(
            c.public for c in ctx.stores.checkpoints.list_for_run(run_id)))):
        return run
    raise NotFoundError(f"training_run_id: no training run {run_id!r}",
                        field="training_run_id")


@router.get("/training_runs", response_model_exclude_unset=True)
async def list_runs(request: Request, tenant: Tenant, limit: int = 20, offset: int = 0,
                    access_scope: str = "owned") -> TrainingRunsResponse:
    convert.page(limit, offset)
    ctx = ctx_of(request)
    runs, total = ctx.stores.runs.page(tenant, include_public=access_scope == "accessible",
                                       limit=limit, offset=offset)
    return TrainingRunsResponse(training_runs=[run_view(ctx, r, tenant) for r in runs],
                                cursor=Cursor(offset=offset, limit=limit, total_count=total))


@router.get("/training_runs/{run_id}", response_model_exclude_unset=True)
async def get_run(run_id: str, request: Request, tenant: Tenant,
                  access_scope: str = "owned") -> TrainingRun:
    ctx = ctx_of(request)
    run = _visible_run(ctx, run_id, tenant, access_scope == "accessible")
    return run_view(ctx, run, tenant)


@router.get("/training_runs/{run_id}/checkpoints", response_model_exclude_unset=True)
async def list_checkpoints(run_id: str, request: Request, tenant: Tenant
                           ) -> CheckpointsListResponse:
    ctx = ctx_of(request)
    run = _visible_run(ctx, run_id, tenant, accessible=True)
    records = [c for c in ctx.stores.checkpoints.list_for_run(run.run.model_id)
               if c.readable_by(tenant)]
    return CheckpointsListResponse(checkpoints=[checkpoint_view(c) for c in records])


@router.get("/checkpoints", response_model_exclude_unset=True)
async def list_user_checkpoints(request: Request, tenant: Tenant, limit: int = 100,
                                offset: int = 0) -> CheckpointsListResponse:
    convert.page(limit, offset)
    records, total = ctx_of(request).stores.checkpoints.list_for_tenant(tenant, limit, offset)
    return CheckpointsListResponse(
        checkpoints=[checkpoint_view(c) for c in records],
        cursor=Cursor(offset=offset, limit=limit, total_count=total))


def _owned(request: Request, tenant: str, run_id: str, kind: str, name: str
           ) -> tuple[ServerContext, CheckpointRecord]:
    ctx = ctx_of(request)
    return ctx, owned_checkpoint(ctx, tenant, run_id, kind, name)


@router.delete("/training_runs/{run_id}/checkpoints/{kind}/{name}")
async def delete_checkpoint(run_id: str, kind: str, name: str, request: Request,
                            tenant: Tenant) -> Response:
    ctx, record = _owned(request, tenant, run_id, kind, name)
    ctx.stores.checkpoints.delete(record)
    forget_checkpoint(ctx, record.path)
    return Response(status_code=204)


@router.post("/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
@router.delete("/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
async def publish(run_id: str, kind: str, name: str, request: Request,
                  tenant: Tenant) -> Response:
    """POST publishes, DELETE unpublishes."""
    ctx, record = _owned(request, tenant, run_id, kind, name)
    ctx.stores.checkpoints.set_public(record, request.method == "POST")
    return Response(status_code=204)


@router.put("/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl")
async def set_ttl(run_id: str, kind: str, name: str, request: Request,
                  tenant: Tenant) -> Response:
    ctx, body = await parse_body(request, schemas.SetCheckpointTtlRequest)
    _, record = _owned(request, tenant, run_id, kind, name)
    ctx.stores.checkpoints.set_ttl(record, convert.ttl_seconds(body.ttl_seconds))
    return Response(status_code=204)
