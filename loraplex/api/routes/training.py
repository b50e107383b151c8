"""forward / forward_backward (protobuf in, optionally zstd) and optim_step
(tinker-api.md §5.2-5.3). Both go through `submit_training`, so they run in seq_id order."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from loraplex.api import codec, convert, schemas
from loraplex.api.access import LiveRun
from loraplex.api.auth import Tenant
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.submission import json_address, submit_training
from loraplex.domain.data import Datum
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.scheduler.ops import ForwardBackwardOp, OptimStepOp, RequestKind
from loraplex.scheduler.provenance import attach_recorded_logprobs, referenced_sequence_ids

router = APIRouter(prefix="/api/v1")


@router.post("/forward_backward")
async def forward_backward(request: Request, tenant: Tenant) -> dict[str, Any]:
    msg = codec.decode_forward_backward(await request.body(),
                                        request.headers.get("content-encoding"))
    ctx = ctx_of(request)

    def build(live: LiveRun, request_id: str) -> ForwardBackwardOp:
        data = codec.datums(msg)
        loss_fn = msg.loss_fn
        convert.check_datums(data, live.served.info, loss_fn)
        if loss_fn == "stable_reinforce":
            data = with_recorded_logprobs(ctx, data, live.run.session_id)
        work = ForwardBackwardWork(
            request_id=request_id, adapter_id=msg.model_id, data=data, loss_fn=loss_fn,
            loss_fn_config=codec.loss_fn_config(msg), forward_only=msg.forward_only)
        return ForwardBackwardOp(work)

    kind: RequestKind = "Forward" if msg.forward_only else "ForwardBackward"
    return submit_training(ctx, tenant, msg.model_id, msg.seq_id, kind, build)


def with_recorded_logprobs(ctx: ServerContext, data: tuple[Datum, ...], session_id: str
                           ) -> tuple[Datum, ...]:
    recorded = ctx.stores.sequences.lookup(referenced_sequence_ids(data))
    return attach_recorded_logprobs(data, recorded, session_id)


@router.post("/optim_step")
async def optim_step(request: Request, tenant: Tenant) -> dict[str, Any]:
    raw = await request.body()
    address = json_address(raw)

    def build(live: LiveRun, request_id: str) -> OptimStepOp:
        body = schemas.parse(schemas.OptimStepRequest, raw)
        params = convert.adam_params(body.optim_params)
        return OptimStepOp(OptimStepWork(request_id=request_id, adapter_id=live.run.model_id,
                                         adam=params))

    return submit_training(ctx_of(request), tenant, address.get("model_id"),
                           address.get("seq_id"), "OptimStep", build)
