"""``GET /api/v1/loraplex/dashboard/tenant``: the calling tenant's training runs, checkpoints and
sampling sessions, as the dashboard's tenant view lists them (own tenant only, newest first,
at most ``limit`` of each with the totals).

Runs carry their counters (steps, trained tokens), adapter and optimizer config and whether
they are live in engine memory; checkpoints their size, TTL, published state and a signed
download URL of their archive (a plain GET, no key: `loraplex.api.routes.downloads`). Usage is
``GET /api/v1/loraplex/usage``; curves are ``.../training_runs/{id}/metrics``.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from loraplex.api import convert
from loraplex.api.auth import Caller
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.download_links import archive_link
from loraplex.api.responses.tenant_view import (
    CheckpointRow,
    LoraView,
    RunRow,
    SamplerRow,
    TenantView,
)
from loraplex.domain.eval_score import EvalScore
from loraplex.errors import UserError
from loraplex.store.checkpoints import CheckpointRecord
from loraplex.store.runs import TrainingRunRecord
from loraplex.store.samplers import SamplerRecord

router = APIRouter(prefix="/api/v1")


@router.get("/loraplex/dashboard/tenant", response_model_exclude_unset=True)
async def tenant_view(request: Request, caller: Caller, limit: int = 100) -> TenantView:
    convert.page(limit, 0)
    ctx = ctx_of(request)
    tenant = caller.tenant
    runs, num_runs = ctx.stores.runs.page(tenant, include_public=False, limit=limit, offset=0)
    checkpoints, num_checkpoints = ctx.stores.checkpoints.list_for_tenant(tenant, limit, 0)
    samplers, num_samplers = ctx.stores.samplers.page(tenant, limit, 0)
    now = time.time()
    evals = ctx.stores.eval_scores.list_for([str(c.path) for c in checkpoints])
    return TenantView(
        tenant=tenant, is_operator=caller.is_operator, now=now,
        runs=[run_row(ctx, r) for r in runs], num_runs=num_runs,
        checkpoints=[checkpoint_row(ctx, request, c, tenant, now, evals[str(c.path)])
                     for c in checkpoints],
        num_checkpoints=num_checkpoints,
        sampling_sessions=[sampler_row(s) for s in samplers],
        num_sampling_sessions=num_samplers)


def run_row(ctx: ServerContext, record: TrainingRunRecord) -> RunRow:
    run = record.run
    lora = run.lora
    return RunRow(
        model_id=run.model_id, base_model=run.base_model, session_id=run.session_id,
        created_at=record.created_at, last_request_time=record.last_request_time,
        num_steps=record.num_steps, num_trained_tokens=record.num_trained_tokens,
        lora=LoraView(rank=lora.rank, alpha=lora.alpha, train_attn=lora.train_attn,
                      train_mlp=lora.train_mlp, train_unembed=lora.train_unembed,
                      seed=lora.seed),
        optimizer_config=dict(run.optimizer_config),
        user_metadata=dict(run.user_metadata), is_live=_is_live(ctx, record))


def _is_live(ctx: ServerContext, record: TrainingRunRecord) -> bool:
    try:
        served = ctx.catalog.get(record.run.base_model)
    except UserError:  # a model this server no longer serves
        return False
    return served.lanes.has_model(record.run.model_id)


def checkpoint_row(ctx: ServerContext, request: Request, c: CheckpointRecord, tenant: str,
                   now: float, evals: list[EvalScore]) -> CheckpointRow:
    url, expires = archive_link(ctx, request, tenant, c.path)
    return CheckpointRow(
        tinker_path=str(c.path), run_id=c.path.run_id,
        checkpoint_id=c.path.checkpoint_id, kind=c.path.kind, name=c.path.name,
        size_bytes=c.size_bytes, created_at=c.created_at, expires_at=c.expires_at,
        ttl_left_s=None if c.expires_at is None else max(0.0, c.expires_at - now),
        public=c.public, user_metadata=dict(c.user_metadata),
        download_url=url, download_expires_at=expires, evals=evals)


def sampler_row(s: SamplerRecord) -> SamplerRow:
    return SamplerRow(sampler_id=s.sampler_id, session_id=s.session_id,
                      base_model=s.base_model, source=s.source, model_path=s.model_path,
                      model_id=s.model_id, created_at=s.created_at)
