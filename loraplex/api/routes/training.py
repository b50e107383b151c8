"""forward / forward_backward (protobuf in, optionally zstd) and optim_step
(tinker-api.md §5.2-5.3). Both take their seq slot through `api.submission`, so they run in
seq_id order; a forward_backward body is decoded once, off the event loop."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from loraplex.api import codec, convert, schemas
from loraplex.api.auth import Tenant
from loraplex.api.body import request_body
from loraplex.api.context import ServerContext
from loraplex.api.model_input import placed_datum
from loraplex.api.provenance import with_recorded_logprobs
from loraplex.api.submission import (
    TrainingSlot,
    json_slot,
    keeps_slot,
    submit_training,
    training_slot,
)
from loraplex.domain.custom_loss import CUSTOM_LOSS_FN
from loraplex.domain.ops import RequestKind
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.errors import user_error

router = APIRouter(prefix="/api/v1")


@router.post("/forward_backward")
async def forward_backward(request: Request, tenant: Tenant) -> dict[str, str]:
    ctx, raw = await request_body(request)
    body = await asyncio.to_thread(codec.decode_forward_backward, raw,
                                   request.headers.get("content-encoding"), ctx.config.limits)
    slot = training_slot(ctx, tenant, body.model_id, body.seq_id)
    kind: RequestKind = "Forward" if body.forward_only else "ForwardBackward"
    return submit_training(ctx, tenant, slot, kind, forward_backward_op(ctx, slot, body))


@keeps_slot
def forward_backward_op(ctx: ServerContext, slot: TrainingSlot, body: codec.ForwardBackwardBody
                        ) -> ForwardBackwardWork:
    """Validate the datums against the served model; resolve stable_reinforce provenance."""
    if body.problem is not None:
        raise body.problem
    if body.loss_fn == CUSTOM_LOSS_FN:
        return custom_work(ctx, slot, body)
    loss_fn = convert.loss_fn_name(body.loss_fn)
    data = tuple(placed_datum(d, slot.live.served.info) for d in body.data)
    convert.check_datums(data, slot.live.served.info)
    if loss_fn == "stable_reinforce":
        data = with_recorded_logprobs(ctx.stores.sequences, data, slot.live.run.session_id)
    return ForwardBackwardWork(request_id=slot.request_id, adapter_id=slot.model_id, data=data,
                               loss_fn=loss_fn, loss_fn_config=body.loss_fn_config,
                               forward_only=body.forward_only)


def custom_work(ctx: ServerContext, slot: TrainingSlot, body: codec.ForwardBackwardBody
                ) -> ForwardBackwardWork:
    """A forward_backward of an uploaded loss: ``loss_fn_config`` is ``{"loss_id": ...}``, a
    loss of this training run's session (anything else fails the future as not found)."""
    config = dict(body.loss_fn_config)
    loss_id = config.pop("loss_id", None)
    if not isinstance(loss_id, str) or config:
        raise user_error("loss_fn_config", "a custom loss takes exactly {'loss_id': <str>}")
    loss = ctx.stores.custom_losses.get(loss_id, slot.live.run.tenant, slot.live.run.session_id)
    data = tuple(placed_datum(d, slot.live.served.info) for d in body.data)
    convert.check_datums(data, slot.live.served.info, aligned=False)
    return ForwardBackwardWork(request_id=slot.request_id, adapter_id=slot.model_id,
                               data=data, loss_fn=CUSTOM_LOSS_FN, loss_fn_config={},
                               forward_only=body.forward_only, custom_loss=loss)


@router.post("/optim_step")
async def optim_step(request: Request, tenant: Tenant) -> dict[str, str]:
    ctx, raw = await request_body(request)
    slot = json_slot(ctx, tenant, raw)
    return submit_training(ctx, tenant, slot, "OptimStep", optim_step_op(slot, raw))


@keeps_slot
def optim_step_op(slot: TrainingSlot, raw: bytes) -> OptimStepWork:
    body = schemas.parse(schemas.OptimStepRequest, raw)
    family = slot.live.run.optimizer_config.get("type", "adamw")
    return OptimStepWork(request_id=slot.request_id, adapter_id=slot.model_id,
                         params=convert.optim_params(body.optim_params, family))
