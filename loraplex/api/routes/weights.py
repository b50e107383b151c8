"""Checkpoint ops of a training run: save_weights (save_state), save_weights_for_sampler (named
or ephemeral snapshot / inflight), save_weights_external (PEFT export, optionally age-encrypted),
load_weights in its three shapes, and weights_info (tinker-api.md §5.4, §9.3, §11)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api import convert, schemas
from loraplex.api.access import LiveRun, readable_checkpoint
from loraplex.api.auth import Tenant
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.submission import json_address, new_request_id, submit_training
from loraplex.domain import ids
from loraplex.domain.ids import CheckpointKind, TinkerPath
from loraplex.domain.work import LoadWork
from loraplex.errors import user_error
from loraplex.scheduler.ops import LoadOp, SaveOp, SnapshotOp, WorkItem
from loraplex.store.encryption import parse_recipients
from loraplex.store.runs import TrainingRunRecord

router = APIRouter(prefix="/api/v1")


def _save_op(ctx: ServerContext, tenant: str, live: LiveRun, kind: CheckpointKind,
             name: str, *, ttl: int | None, overwrite: bool, user_metadata: Any,
             with_optimizer: bool, encrypt_to: tuple[str, ...] = ()) -> SaveOp:
    path = TinkerPath(live.run.model_id, kind, ids.validate_checkpoint_name(name))
    pending = ctx.stores.checkpoints.allocate(
        path, tenant, ttl_seconds=convert.ttl_seconds(ttl), overwrite=overwrite,
        user_metadata={str(k): str(v) for k, v in (user_metadata or {}).items()})
    return SaveOp(live.run.model_id, pending, with_optimizer, encrypt_to)


@router.post("/save_weights")
async def save_weights(request: Request, tenant: Tenant) -> dict[str, Any]:
    raw = await request.body()
    address, ctx = json_address(raw), ctx_of(request)

    def build(live: LiveRun, request_id: str) -> SaveOp:
        body = schemas.parse(schemas.SaveWeightsRequest, raw)
        name = body.path if body.path is not None else f"{body.seq_id:06d}"
        return _save_op(ctx, tenant, live, "weights", name, ttl=body.ttl_seconds,
                        overwrite=body.overwrite, user_metadata=body.user_metadata,
                        with_optimizer=True)

    return submit_training(ctx, tenant, address.get("model_id"), address.get("seq_id"),
                           "SaveWeights", build)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request, tenant: Tenant) -> dict[str, Any]:
    raw = await request.body()
    address, ctx = json_address(raw), ctx_of(request)

    def build(live: LiveRun, request_id: str) -> SaveOp | SnapshotOp:
        body = schemas.parse(schemas.SaveWeightsForSamplerRequest, raw)
        if body.path is not None:
            return _save_op(ctx, tenant, live, "sampler_weights", body.path,
                            ttl=body.ttl_seconds, overwrite=False,
                            user_metadata=body.user_metadata, with_optimizer=False)
        if body.sampling_session_seq_id is None:
            raise user_error("path", "give a path (named save) or a sampling_session_seq_id "
                             "(ephemeral save)")
        sampler_id = ids.sampling_session_id(live.run.session_id, body.sampling_session_seq_id)
        return SnapshotOp(live.run.model_id, sampler_id, live.run.session_id, tenant,
                          live.run.base_model, body.kind)

    return submit_training(ctx, tenant, address.get("model_id"), address.get("seq_id"),
                           "SaveWeightsForSampler", build)


@router.post("/save_weights_external")
async def save_weights_external(request: Request, tenant: Tenant) -> dict[str, Any]:
    raw = await request.body()
    address, ctx = json_address(raw), ctx_of(request)

    def build(live: LiveRun, request_id: str) -> SaveOp:
        body = schemas.parse(schemas.SaveWeightsExternalRequest, raw)
        recipients = tuple(body.age_encryption_recipients or ())
        if body.age_encryption_recipients is not None:
            parse_recipients(recipients)
        return _save_op(ctx, tenant, live, "external_weights", body.path,
                        ttl=body.ttl_seconds, overwrite=True, user_metadata=None,
                        with_optimizer=False, encrypt_to=recipients)

    return submit_training(ctx, tenant, address.get("model_id"), address.get("seq_id"),
                           "SaveWeightsExternal", build)


@router.post("/load_weights")
async def load_weights(request: Request, tenant: Tenant) -> dict[str, Any]:
    """Create-via-load (``session_id`` + ``model_seq_id``: a new run, its seq 0, LoRA config
    from the checkpoint) or a load into an existing run (``model_id`` + ``seq_id``)."""
    raw = await request.body()
    ctx = ctx_of(request)
    address = json_address(raw)
    if address.get("session_id") is None:
        def build(live: LiveRun, request_id: str) -> LoadOp:
            body = schemas.parse(schemas.LoadWeightsRequest, raw)
            record, _ = readable_checkpoint(ctx, tenant, body.path)
            work = LoadWork(live.run.model_id, record.directory, body.optimizer,
                            expect_config=live.run.lora)
            return LoadOp(work, record.path)

        return submit_training(ctx, tenant, address.get("model_id"), address.get("seq_id"),
                               "LoadWeights", build)
    return _create_via_load(ctx, tenant, schemas.parse(schemas.LoadWeightsRequest, raw))


def _create_via_load(ctx: ServerContext, tenant: str,
                     body: schemas.LoadWeightsRequest) -> dict[str, Any]:
    if body.model_seq_id is None:
        raise user_error("model_seq_id", "required with session_id")
    ctx.stores.sessions.get_open(body.session_id or "", tenant)
    record, source_run = readable_checkpoint(ctx, tenant, body.path)
    served = ctx.catalog.get(body.base_model or source_run.base_model)
    if served.scheduler is not ctx.catalog.get(source_run.base_model).scheduler:
        raise user_error("base_model", f"{served.name!r} is not compatible with the "
                         f"checkpoint's base model {source_run.base_model!r}")
    model_id = ids.model_id(body.session_id or "", body.model_seq_id)
    now = time.time()
    new_run = TrainingRunRecord(
        model_id=model_id, tenant=tenant, session_id=body.session_id or "",
        base_model=served.name, lora=source_run.lora,
        optimizer_config=convert.optimizer_config(body.optimizer_config),
        user_metadata=body.user_metadata or dict(source_run.user_metadata),
        created_at=now, last_request_time=now, num_steps=0, num_trained_tokens=0)
    work = LoadWork(model_id, record.directory, body.optimizer)
    item = WorkItem(new_request_id(), tenant, "LoadWeights",
                    LoadOp(work, record.path, new_run), model_id=model_id, seq_id=0)
    admitted = served.scheduler.submit(item)
    return {"request_id": admitted.request_id, "model_id": model_id}


@router.post("/weights_info")
async def weights_info(request: Request, tenant: Tenant) -> dict[str, Any]:
    body = schemas.parse(schemas.WeightsInfoRequest, await request.body())
    _, run = readable_checkpoint(ctx_of(request), tenant, body.tinker_path, "tinker_path")
    return {"base_model": run.base_model, "is_lora": True, "lora_rank": run.lora.rank,
            "train_unembed": run.lora.train_unembed, "train_mlp": run.lora.train_mlp,
            "train_attn": run.lora.train_attn, "optimizer_config": dict(run.optimizer_config)}
