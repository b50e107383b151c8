"""The bootstrap and liveness answers that are not the SDK's own types: dynamic config and
healthz (client config is the server's free-form JSON overrides)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class DynamicConfig(BaseModel):
    refresh_interval_sec: int
    sample_cancel_enabled: bool


class Health(BaseModel):
    """``ok``, or ``degraded`` with what is wrong (``problems`` is set only then)."""

    status: Literal["ok", "degraded"]
    problems: list[str] | None = None
