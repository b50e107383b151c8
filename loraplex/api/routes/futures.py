"""retrieve_future: long-poll a future, then answer its result in the encoding the SDK expects
(protobuf for forward/forward_backward and sample, JSON otherwise), its failure as
``{"error", "category"}``, or ``try_again`` with the tenant's queue state (tinker-api.md §4)."""

from __future__ import annotations

from typing import Any, assert_never

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from loraplex.api import codec, schemas
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.context import ServerContext
from loraplex.api.errors import failure_json
from loraplex.api.longpoll import wait_until_done
from loraplex.domain.ops import (
    CheckpointSaved,
    CustomLossCreated,
    ModelCreated,
    Sampled,
    SamplerSnapshotReady,
    WeightsLoaded,
)
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.scheduler.futures import FutureEntry

router = APIRouter(prefix="/api/v1")

_SAVE_TYPES = {"weights": "save_weights", "sampler_weights": "save_weights_for_sampler",
               "external_weights": "save_weights_external"}


@router.post("/retrieve_future")
async def retrieve_future(request: Request, tenant: Tenant) -> Response:
    ctx, body = await parse_body(request, schemas.FutureRetrieveRequest)
    entry = ctx.futures.get(body.request_id, tenant)
    if not entry.is_done:
        await wait_until_done(ctx.futures, body.request_id, ctx.config.long_poll_s)
        entry = ctx.futures.get(body.request_id, tenant)
    if not entry.is_done:
        return JSONResponse({"type": "try_again", "request_id": body.request_id,
                             "queue_state": _queue_state(ctx, tenant)})
    response = render(entry)
    ctx.futures.mark_fetched(body.request_id)
    return response


def render(entry: FutureEntry) -> Response:
    """The HTTP answer for a completed future: protobuf for forward/backward and sample
    results, JSON for the rest, ``{"error", "category"}`` for a failure."""
    if entry.error is not None:
        return JSONResponse(failure_json(entry.error))
    result = entry.result
    match result:
        case ForwardBackwardResult():
            return Response(codec.encode_forward_backward(result),
                            media_type=codec.PROTO_CONTENT_TYPE)
        case Sampled():
            return Response(codec.encode_sample(result.result),
                            media_type=codec.PROTO_CONTENT_TYPE)
        case ModelCreated():
            return JSONResponse({"type": "create_model", "model_id": result.model_id})
        case OptimStepResult():
            return JSONResponse({"type": "optim_step", "metrics": dict(result.metrics)})
        case CheckpointSaved():
            out: dict[str, Any] = {"type": _SAVE_TYPES[result.kind], "path": result.path}
            if result.kind == "external_weights":
                out["size_bytes"] = result.size_bytes
            return JSONResponse(out)
        case SamplerSnapshotReady():
            return JSONResponse({"type": "save_weights_for_sampler",
                                 "sampling_session_id": result.sampling_session_id})
        case CustomLossCreated():
            return JSONResponse({"type": "create_custom_loss", "loss_id": result.loss_id})
        case WeightsLoaded():
            return JSONResponse({"type": "load_weights", "model_id": result.model_id,
                                 "path": result.path})
        case None:
            raise AssertionError(f"future {entry.request_id} is done without a result")
        case _:
            assert_never(result)


def _queue_state(ctx: ServerContext, tenant: str) -> str:
    states = {lanes.queue_state(tenant) for lanes in ctx.catalog.lanes()}
    for state in ("paused_rate_limit", "paused_capacity"):  # the most severe one
        if state in states:
            return state
    return "active"
