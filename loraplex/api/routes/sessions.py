"""Sessions: create, heartbeat, finish (releases the session's training adapters from engine
memory), and the REST listing (tinker-api.md §3.3-3.5, §5)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from tinker import types as sdk

from loraplex.api import convert, schemas
from loraplex.api.access import release_session
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.context import ctx_of

router = APIRouter(prefix="/api/v1")


@router.post("/create_session", response_model_exclude_unset=True)
async def create_session(request: Request, tenant: Tenant) -> sdk.CreateSessionResponse:
    ctx, body = await parse_body(request, schemas.CreateSessionRequest)
    record = ctx.stores.sessions.create(
        tenant, tags=list(body.tags), user_metadata=body.user_metadata or {},
        sdk_version=body.sdk_version, project_id=body.project_id,
        display_name=body.display_name)
    return sdk.CreateSessionResponse(type="create_session", session_id=record.session_id)


@router.post("/session_heartbeat", response_model_exclude_unset=True)
async def heartbeat(request: Request, tenant: Tenant) -> sdk.SessionHeartbeatResponse:
    ctx, body = await parse_body(request, schemas.SessionHeartbeatRequest)
    ctx.stores.sessions.heartbeat(body.session_id, tenant)
    return sdk.SessionHeartbeatResponse(type="session_heartbeat")


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, request: Request, tenant: Tenant) -> dict[str, str]:
    ctx, body = await parse_body(request, schemas.SessionFinishRequest)
    reason = str((body.reason or {}).get("type", "success"))
    ctx.stores.sessions.finish(session_id, tenant, reason)
    release_session(ctx, session_id)
    return {}


@router.get("/sessions", response_model_exclude_unset=True)
async def list_sessions(request: Request, tenant: Tenant, limit: int = 20, offset: int = 0,
                        access_scope: str = "owned") -> sdk.ListSessionsResponse:
    convert.page(limit, offset)
    records, _ = ctx_of(request).stores.sessions.page(tenant, limit, offset)
    return sdk.ListSessionsResponse(sessions=[r.session_id for r in records])


@router.get("/sessions/{session_id}", response_model_exclude_unset=True)
async def get_session(session_id: str, request: Request, tenant: Tenant,
                      access_scope: str = "owned") -> sdk.GetSessionResponse:
    stores = ctx_of(request).stores
    record = stores.sessions.get(session_id, tenant)
    return sdk.GetSessionResponse(
        training_run_ids=[r.run.model_id for r in stores.runs.for_session(session_id)],
        sampler_ids=[s.sampler_id for s in stores.samplers.for_session(session_id)],
        user_metadata={str(k): str(v) for k, v in record.user_metadata.items()},
        display_name=record.display_name)
