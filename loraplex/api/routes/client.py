"""Bootstrap and liveness: client config (mandatory for every SDK), dynamic config, telemetry,
server capabilities and healthz (tinker-api.md §3, §5)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import JsonValue
from tinker import types as sdk

from loraplex.api.auth import KeyHolder, Tenant
from loraplex.api.body import read_body
from loraplex.api.context import ctx_of
from loraplex.api.jwt_tokens import JwtIssuer
from loraplex.api.responses.client import DynamicConfig, Health
from loraplex.config import LimitsConfig
from loraplex.errors import NotFoundError

router = APIRouter(prefix="/api/v1")


SERVER_FEATURES: dict[str, bool] = {
    "custom_loss_server_side": True,
    "sample_use_retrieve_futures": True,
    "sample_join_sampling_session": True,
}
"""The SDK 0.38 features this server implements (off in the SDK's defaults); ``client_config``
in the server config may switch them off again."""


@router.post("/client/config")
async def client_config(request: Request) -> dict[str, JsonValue]:
    """The server's features, plus its overrides (chunk sizes, ordering, transport)."""
    jwt = {"pjwt_auth_enabled": request.app.state.jwt_issuer is not None}
    return {**SERVER_FEATURES, **jwt, **ctx_of(request).config.client_config}


@router.post("/auth/token")
async def auth_token(request: Request, caller: KeyHolder) -> dict[str, str]:
    """JWT mode: the API key's principal as a short-lived JWT (404 when JWT mode is off)."""
    issuer: JwtIssuer | None = request.app.state.jwt_issuer
    if issuer is None:
        raise NotFoundError("/api/v1/auth/token: JWT mode is off on this server (API keys "
                            "only)")
    return {"jwt": issuer.issue(caller)}


@router.post("/client/dynamic_config", response_model_exclude_unset=True)
async def dynamic_config() -> DynamicConfig:
    return DynamicConfig(refresh_interval_sec=300, sample_cancel_enabled=False)


TELEMETRY_LIMITS = LimitsConfig(max_body_bytes=64 << 10)
"""Telemetry needs no key, so its bodies get a small limit of their own (the SDK's batches
are a few KiB)."""


@router.post("/telemetry")
async def telemetry(request: Request) -> dict[str, str]:
    """Accepted and dropped: the server keeps no client telemetry (HTTP 413 past 64 KiB)."""
    await read_body(request, TELEMETRY_LIMITS)
    return {"status": "accepted"}


@router.get("/healthz", response_model_exclude_unset=True)
async def healthz(request: Request) -> Health:
    """``ok``, or ``degraded`` with what is wrong (the server answers either way: a lost Ray
    head or no live engine worker of a model makes its ops fail with retryable errors)."""
    problems = [f"{', '.join(m.name for m in ctx_of(request).catalog if m.lanes is lanes)}: "
                f"{problem}" for lanes in ctx_of(request).catalog.lanes()
                if (problem := lanes.problem()) is not None]
    return Health(status="degraded", problems=problems) if problems else Health(status="ok")


@router.get("/get_server_capabilities", response_model_exclude_none=True)
async def capabilities(request: Request, tenant: Tenant) -> sdk.GetServerCapabilitiesResponse:
    models = [sdk.SupportedModel(model_name=m.name, max_context_length=m.info.max_context,
                                 trainable=True, sampleable=True)
              for m in ctx_of(request).catalog]
    return sdk.GetServerCapabilitiesResponse(supported_models=models)
