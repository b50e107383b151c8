"""retrieve_future: long-poll a future, then answer its result in the encoding the SDK expects
(protobuf for forward/forward_backward and sample, JSON otherwise), its failure as
``{"error", "category"}``, or ``try_again`` with the tenant's queue state (tinker-api.md §4)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from loraplex.api import codec, schemas
from loraplex.api.auth import Tenant
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.errors import failure_json
from loraplex.api.longpoll import wait_until_done
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.scheduler.futures import FutureEntry
from loraplex.scheduler.ops import (
    CheckpointSaved,
    ModelCreated,
    Sampled,
    SamplerSnapshotReady,
    WeightsLoaded,
)

router = APIRouter(prefix="/api/v1")

_SAVE_TYPES = {"weights": "save_weights", "sampler_weights": "save_weights_for_sampler",
               "external_weights": "save_weights_external"}


@router.post("/retrieve_future")
async def retrieve_future(request: Request, tenant: Tenant) -> Response:
    body = schemas.parse(schemas.FutureRetrieveRequest, await request.body())
    ctx = ctx_of(request)
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
    """The HTTP answer for a completed future."""
    if entry.error is not None:
        return JSONResponse(failure_json(entry.error))
    result = entry.result
    if isinstance(result, ForwardBackwardResult):
        return Response(codec.encode_forward_backward(result),
                        media_type=codec.PROTO_CONTENT_TYPE)
    if isinstance(result, Sampled):
        return Response(codec.encode_sample(result.result), media_type=codec.PROTO_CONTENT_TYPE)
    return JSONResponse(_json_result(result))


def _json_result(result: Any) -> dict[str, Any]:
    if isinstance(result, ModelCreated):
        return {"type": "create_model", "model_id": result.model_id}
    if isinstance(result, OptimStepResult):
        return {"type": "optim_step", "metrics": dict(result.metrics)}
    if isinstance(result, CheckpointSaved):
        out: dict[str, Any] = {"type": _SAVE_TYPES[result.kind], "path": result.path}
        if result.kind == "external_weights":
            out["size_bytes"] = result.size_bytes
        return out
    if isinstance(result, SamplerSnapshotReady):
        return {"type": "save_weights_for_sampler",
                "sampling_session_id": result.sampling_session_id}
    if isinstance(result, WeightsLoaded):
        return {"type": "load_weights", "model_id": result.model_id, "path": result.path}
    return {}


def _queue_state(ctx: ServerContext, tenant: str) -> str:
    states = {s.scheduler.queue_state(tenant) for s in ctx.catalog}
    for state in ("paused_rate_limit", "paused_capacity"):  # the most severe one
        if state in states:
            return state
    return "active"
