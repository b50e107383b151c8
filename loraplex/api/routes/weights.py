"""Checkpoint ops of a training run: save_weights (save_state), save_weights_for_sampler (named
or ephemeral snapshot / inflight), save_weights_external (PEFT export, optionally age-encrypted),
load_weights in its three shapes, and weights_info (tinker-api.md §5.4, §9.3, §11)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api import convert, schemas
from loraplex.api.access import check_checkpoint_quota, check_run_quota, readable_checkpoint
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body, request_body
from loraplex.api.context import ServerContext
from loraplex.api.submission import (
    TrainingSlot,
    json_address,
    json_slot,
    keeps_slot,
    new_request_id,
    submit_json,
    submit_training,
)
from loraplex.domain import ids
from loraplex.domain.ids import CheckpointKind, TinkerPath
from loraplex.domain.ops import LoadOp, SaveOp, SnapshotOp, WorkItem
from loraplex.domain.training_run import TrainingRun
from loraplex.domain.work import LoadWork
from loraplex.errors import user_error
from loraplex.store.encryption import parse_recipients

router = APIRouter(prefix="/api/v1")


@router.post("/save_weights")
async def save_weights(request: Request, tenant: Tenant) -> dict[str, str]:
    return await submit_json(request, tenant, "SaveWeights", save_weights_op)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request, tenant: Tenant) -> dict[str, str]:
    return await submit_json(request, tenant, "SaveWeightsForSampler", save_for_sampler_op)


@router.post("/save_weights_external")
async def save_weights_external(request: Request, tenant: Tenant) -> dict[str, str]:
    return await submit_json(request, tenant, "SaveWeightsExternal", save_external_op)


@keeps_slot
def save_weights_op(ctx: ServerContext, slot: TrainingSlot, raw: bytes) -> SaveOp:
    body = schemas.parse(schemas.SaveWeightsRequest, raw)
    name = body.path if body.path is not None else f"{body.seq_id:06d}"
    return _save_op(ctx, slot, "weights", name, ttl=body.ttl_seconds, overwrite=body.overwrite,
                    user_metadata=body.user_metadata, with_optimizer=True)


@keeps_slot
def save_for_sampler_op(ctx: ServerContext, slot: TrainingSlot, raw: bytes
                        ) -> SaveOp | SnapshotOp:
    """A named save (``path``) or an ephemeral one (``sampling_session_seq_id``)."""
    body = schemas.parse(schemas.SaveWeightsForSamplerRequest, raw)
    if body.path is not None:
        return _save_op(ctx, slot, "sampler_weights", body.path, ttl=body.ttl_seconds,
                        overwrite=False, user_metadata=body.user_metadata, with_optimizer=False)
    if body.sampling_session_seq_id is None:
        raise user_error("path", "give a path (named save) or a sampling_session_seq_id "
                         "(ephemeral save)")
    run = slot.live.run
    sampler_id = ids.sampling_session_id(run.session_id, body.sampling_session_seq_id)
    return SnapshotOp(run.model_id, sampler_id, run.session_id, run.tenant, run.base_model,
                      body.kind)


@keeps_slot
def save_external_op(ctx: ServerContext, slot: TrainingSlot, raw: bytes) -> SaveOp:
    body = schemas.parse(schemas.SaveWeightsExternalRequest, raw)
    recipients = tuple(body.age_encryption_recipients or ())
    if body.age_encryption_recipients is not None:
        parse_recipients(recipients)
    return _save_op(ctx, slot, "external_weights", body.path, ttl=body.ttl_seconds,
                    overwrite=True, user_metadata=None, with_optimizer=False,
                    encrypt_to=recipients)


def _save_op(ctx: ServerContext, slot: TrainingSlot, kind: CheckpointKind, name: str, *,
             ttl: int | None, overwrite: bool, user_metadata: Mapping[str, str] | None,
             with_optimizer: bool,
             encrypt_to: tuple[str, ...] = ()) -> SaveOp:
    """Reserve the checkpoint directory of a save (the one helper every save route uses)."""
    path = TinkerPath(slot.model_id, kind, ids.validate_checkpoint_name(name))
    check_checkpoint_quota(ctx, slot.live.run.tenant)
    reserved = ctx.stores.checkpoints.allocate(
        path, slot.live.run.tenant, ttl_seconds=convert.ttl_seconds(ttl), overwrite=overwrite,
        user_metadata={str(k): str(v) for k, v in (user_metadata or {}).items()})
    return SaveOp(slot.model_id, reserved, with_optimizer, encrypt_to)


@router.post("/load_weights")
async def load_weights(request: Request, tenant: Tenant) -> dict[str, Any]:
    """Create-via-load (``session_id`` + ``model_seq_id``: a new run, its seq 0, LoRA config
    from the checkpoint) or a load into an existing run (``model_id`` + ``seq_id``)."""
    ctx, raw = await request_body(request)
    if json_address(raw).get("session_id") is not None:
        return _create_via_load(ctx, tenant, schemas.parse(schemas.LoadWeightsRequest, raw))
    slot = json_slot(ctx, tenant, raw)
    return submit_training(ctx, tenant, slot, "LoadWeights", load_weights_op(ctx, slot, raw))


@keeps_slot
def load_weights_op(ctx: ServerContext, slot: TrainingSlot, raw: bytes) -> LoadOp:
    body = schemas.parse(schemas.LoadWeightsRequest, raw)
    record, source_run = readable_checkpoint(ctx, slot.live.run.tenant, body.path)
    if body.optimizer:
        same_family(source_run.optimizer_config, slot.live.run.optimizer_config, "path")
    work = LoadWork(slot.model_id, record.directory, body.optimizer,
                    expect_config=slot.live.run.lora)
    return LoadOp(work, record.path)


def _create_via_load(ctx: ServerContext, tenant: str,
                     body: schemas.LoadWeightsRequest) -> dict[str, Any]:
    if body.model_seq_id is None:
        raise user_error("model_seq_id", "required with session_id")
    session_id = body.session_id or ""
    ctx.stores.sessions.get_open(session_id, tenant)
    record, source_run = readable_checkpoint(ctx, tenant, body.path)
    served = ctx.catalog.get(body.base_model or source_run.base_model)
    if served.lanes is not ctx.catalog.get(source_run.base_model).lanes:
        raise user_error("base_model", f"{served.name!r} is not compatible with the "
                         f"checkpoint's base model {source_run.base_model!r}")
    check_run_quota(ctx, tenant)
    model_id = ids.model_id(session_id, convert.model_seq_id(body.model_seq_id))
    new_run = TrainingRun(
        model_id=model_id, tenant=tenant, session_id=session_id, base_model=served.name,
        lora=source_run.lora, optimizer_config=_new_run_optimizer(body, source_run),
        user_metadata=body.user_metadata or dict(source_run.user_metadata))
    work = LoadWork(model_id, record.directory, body.optimizer)
    item = WorkItem(new_request_id(), tenant, "LoadWeights",
                    LoadOp(work, record.path, new_run), model_id=model_id, seq_id=0)
    admitted = served.lanes.submit(item)
    return {"request_id": admitted.request_id, "model_id": model_id}


def _new_run_optimizer(body: schemas.LoadWeightsRequest, source: TrainingRun
                       ) -> dict[str, Any]:
    """With its optimizer state, a run loaded from a checkpoint keeps the checkpoint's optimizer
    (a config naming another family is refused); without, the one the request names."""
    if not body.optimizer:
        return convert.optimizer_config(body.optimizer_config)
    if body.optimizer_config is not None:
        same_family(source.optimizer_config, convert.optimizer_config(body.optimizer_config),
                    "optimizer_config.type")
    return dict(source.optimizer_config)


def same_family(checkpoint: Mapping[str, Any], run: Mapping[str, Any], field: str) -> None:
    """Refuse optimizer state of one family for a run of the other."""
    have, want = checkpoint.get("type", "adamw"), run.get("type", "adamw")
    if have != want:
        raise user_error(field, f"the checkpoint's optimizer state is {have!r}; this model's "
                         f"optimizer is {want!r} (load without the optimizer state instead)")


@router.post("/weights_info")
async def weights_info(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx, body = await parse_body(request, schemas.WeightsInfoRequest)
    _, run = readable_checkpoint(ctx, tenant, body.tinker_path, "tinker_path")
    return {"base_model": run.base_model, "is_lora": True, "lora_rank": run.lora.rank,
            "train_unembed": run.lora.train_unembed, "train_mlp": run.lora.train_mlp,
            "train_attn": run.lora.train_attn, "optimizer_config": dict(run.optimizer_config)}
