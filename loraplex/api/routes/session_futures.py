"""The SDK 0.38 sampling-session endpoints (tinker-api.md §4.7), switched on in client config:

- ``retrieve_futures`` (``sample_use_retrieve_futures``): one long-poll per SamplingClient
  answers which of its samples finished or failed since its cursor (`CompletionFeeds`); the
  SDK then fetches each payload with ``retrieve_future``.
- ``join_sampling_session`` (``sample_join_sampling_session``): an unpickled SamplingClient gets
  a server-allocated clone id, so its seq ids (clone × 10⁹ + n) never collide with another
  copy's.

Both answer 404 for a sampling session of another tenant.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from tinker import types as sdk

from loraplex.api import schemas
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.completion_feeds import CompletionFeeds
from loraplex.api.responses.sampling_sessions import FuturesRetrieveResponse
from loraplex.errors import user_error
from loraplex.store.samplers import MAX_CLONE_ID

router = APIRouter(prefix="/api/v1")

MAX_POLL_S = 30.0
"""Longest hold of one retrieve_futures poll: under the SDK's 45 s HTTP timeout."""


@router.post("/retrieve_futures", response_model_exclude_unset=True)
async def retrieve_futures(request: Request, tenant: Tenant) -> FuturesRetrieveResponse:
    ctx, body = await parse_body(request, schemas.FuturesRetrieveRequest)
    target = body.target
    ctx.stores.samplers.get(target.sampling_session_id, tenant, "target.sampling_session_id")
    if not 0 <= target.cloned_sampler_id <= MAX_CLONE_ID:
        raise user_error("target.cloned_sampler_id", f"must be in [0, {MAX_CLONE_ID}]")
    if body.prev_cursor < 0 or (body.timeout is not None and body.timeout < 0):
        raise user_error("prev_cursor" if body.prev_cursor < 0 else "timeout", "must be ≥ 0")
    feeds: CompletionFeeds = request.app.state.completion_feeds
    wait_s = min(ctx.config.long_poll_s if body.timeout is None else body.timeout, MAX_POLL_S)
    completions, cursor = await feeds.poll(
        (tenant, target.sampling_session_id, target.cloned_sampler_id), body.prev_cursor,
        wait_s)
    return FuturesRetrieveResponse(completions=completions, cursor=cursor)


@router.post("/join_sampling_session", response_model_exclude_unset=True)
async def join_sampling_session(request: Request, tenant: Tenant
                                ) -> sdk.JoinSamplingSessionResponse:
    ctx, body = await parse_body(request, schemas.JoinSamplingSessionRequest)
    ctx.stores.samplers.get(body.sampling_session_id, tenant)
    clone = ctx.stores.samplers.next_clone(body.sampling_session_id)
    return sdk.JoinSamplingSessionResponse(type="join_sampling_session", client_counter=clone)
