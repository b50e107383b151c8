"""Request schemas: the official SDK's own request models, made lenient at the top level.

The SDK's request models (`tinker.types.*Request`) forbid unknown fields, which is right for a
client and wrong for a server that must keep accepting newer SDKs: each schema here subclasses
the SDK model and only relaxes ``extra`` to ``ignore`` (nested models such as ``LoraConfig``
and ``AdamParams`` stay strict, so a misspelled nested field is reported by name). Semantic
checks (ranks, token ids, TTL ranges, ...) happen when converting to domain ops, not here.
Bodies the SDK sends that have no request model (weights_info, the ttl PUT) are declared here.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict
from tinker import types as sdk

from loraplex.api.errors import from_validation

LENIENT = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())


class CreateSessionRequest(sdk.CreateSessionRequest):
    model_config = LENIENT


class SessionHeartbeatRequest(sdk.SessionHeartbeatRequest):
    model_config = LENIENT


class CreateModelRequest(sdk.CreateModelRequest):
    model_config = LENIENT


class GetInfoRequest(sdk.GetInfoRequest):
    model_config = LENIENT


class OptimStepRequest(sdk.OptimStepRequest):
    model_config = LENIENT


class SaveWeightsRequest(sdk.SaveWeightsRequest):
    model_config = LENIENT


class SaveWeightsForSamplerRequest(sdk.SaveWeightsForSamplerRequest):
    model_config = LENIENT


class SaveWeightsExternalRequest(sdk.SaveWeightsExternalRequest):
    model_config = LENIENT


class LoadWeightsRequest(sdk.LoadWeightsRequest):
    model_config = LENIENT


class CreateSamplingSessionRequest(sdk.CreateSamplingSessionRequest):
    model_config = LENIENT


class SampleRequest(sdk.SampleRequest):
    model_config = LENIENT


class FutureRetrieveRequest(sdk.FutureRetrieveRequest):
    model_config = LENIENT


class WeightsInfoRequest(BaseModel):
    """``POST /weights_info`` body (the SDK sends a plain dict)."""

    model_config = LENIENT
    tinker_path: str


class SetCheckpointTtlRequest(BaseModel):
    """``PUT …/ttl`` body: ``{"ttl_seconds": int | null}``."""

    model_config = LENIENT
    ttl_seconds: int | None = None


class SessionFinishRequest(BaseModel):
    """``POST /sessions/{id}/finish``: ``{"reason": {"type": ...}, "detail": ...}``."""

    model_config = LENIENT
    reason: dict[str, Any] | None = None
    detail: str | None = None


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: bytes) -> M:
    """Validate a JSON body; schema errors become a UserError naming the field (HTTP 400)."""
    try:
        return model.model_validate_json(body or b"{}")
    except pydantic.ValidationError as exc:
        raise from_validation(exc) from None


class CreateCustomLossRequest(sdk.CreateCustomLossRequest):
    model_config = LENIENT


class FuturesRetrieveRequest(sdk.FuturesRetrieveRequest):
    model_config = LENIENT


class JoinSamplingSessionRequest(sdk.JoinSamplingSessionRequest):
    model_config = LENIENT


class EvalScoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    task: str
    metric: str
    value: float
    stderr: float | None = None
    num_samples: int | None = None


class PutEvalScoresRequest(BaseModel):
    """``POST /api/v1/loraplex/evals`` (loraplex's own; `loraplex eval` sends it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    path: str
    scores: list[EvalScoreBody] = pydantic.Field(min_length=1, max_length=1000)
