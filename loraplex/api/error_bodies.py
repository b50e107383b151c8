"""The bodies of refused requests, as pydantic models: what `api.errors` sends and what
``/openapi.json`` documents (`api.openapi` takes their JSON Schemas from here)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    """A refused Tinker API request, and the shape of a failed future."""

    error: str = Field(description="what is wrong, naming the field")
    category: Literal["user", "server"]
    detail: str = Field(description="the same message (the SDK prints it)")
    field: str | None = Field(default=None, description="the offending field, when one is")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """What the OpenAI-compatible routes (``/v1/…``) answer a refused request with."""

    error: OpenAIErrorDetail
