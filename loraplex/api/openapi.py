"""The app's OpenAPI 3.1 document, request bodies included.

Routes read their bodies raw (`api.body`) and validate them with the SDK's request models
(`api.schemas`), so FastAPI's own document has the paths and the path / query parameters but
no request bodies. `openapi_document` adds them from `REQUEST_BODIES` (JSON Schemas of the
pydantic models; ``forward_backward`` takes a protobuf body), the OpenAI routes' answers and
stream chunks (`RESPONSE_BODIES`, `api.openai_responses`), the ``X-API-Key`` scheme on every
route that authenticates, and the one error shape of every 4xx (`api.error_bodies`).
A plain function of the app: nothing is cached, nothing is global but the route → model table.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, routing
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from loraplex.api import auth, openai_responses, openai_schemas, schemas
from loraplex.api.codec import PROTO_CONTENT_TYPE
from loraplex.api.error_bodies import ErrorBody, OpenAIError

REF_TEMPLATE = "#/components/schemas/{model}"
API_KEY_SCHEME = "ApiKey"
ERROR_SCHEMA = "Error"
OPENAI_ERROR_SCHEMA = "OpenAIError"
FORWARD_BACKWARD = "POST /api/v1/forward_backward"

REQUEST_BODIES: dict[str, type[BaseModel]] = {
    "POST /api/v1/create_session": schemas.CreateSessionRequest,
    "POST /api/v1/session_heartbeat": schemas.SessionHeartbeatRequest,
    "POST /api/v1/sessions/{session_id}/finish": schemas.SessionFinishRequest,
    "POST /api/v1/create_model": schemas.CreateModelRequest,
    "POST /api/v1/get_info": schemas.GetInfoRequest,
    "POST /api/v1/optim_step": schemas.OptimStepRequest,
    "POST /api/v1/save_weights": schemas.SaveWeightsRequest,
    "POST /api/v1/save_weights_for_sampler": schemas.SaveWeightsForSamplerRequest,
    "POST /api/v1/save_weights_external": schemas.SaveWeightsExternalRequest,
    "POST /api/v1/load_weights": schemas.LoadWeightsRequest,
    "POST /api/v1/weights_info": schemas.WeightsInfoRequest,
    "POST /api/v1/create_sampling_session": schemas.CreateSamplingSessionRequest,
    "POST /api/v1/asample": schemas.SampleRequest,
    "POST /api/v1/retrieve_future": schemas.FutureRetrieveRequest,
    "PUT /api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl":
        schemas.SetCheckpointTtlRequest,
    "POST /api/v1/create_custom_loss": schemas.CreateCustomLossRequest,
    "POST /api/v1/retrieve_futures": schemas.FuturesRetrieveRequest,
    "POST /api/v1/join_sampling_session": schemas.JoinSamplingSessionRequest,
    "POST /v1/completions": openai_schemas.CompletionRequest,
    "POST /tokenize": openai_schemas.TokenizeRequest,
    "POST /api/v1/loraplex/evals": schemas.PutEvalScoresRequest,
    "POST /detokenize": openai_schemas.DetokenizeRequest,
    "POST /v1/chat/completions": openai_schemas.ChatCompletionRequest,
}
"""``METHOD /path`` → the model its route validates the JSON body with (the route's own
``parse_body`` / ``schemas.parse`` call; tests/fuzz/test_openapi.py checks the two agree)."""

RESPONSE_BODIES: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    "POST /v1/completions": (openai_responses.CompletionResponse,
                             openai_responses.CompletionChunk),
    "POST /v1/chat/completions": (openai_responses.ChatCompletionResponse,
                                  openai_responses.ChatCompletionChunk),
}
"""``METHOD /path`` → the body it answers and, with ``stream``, each server-sent event's chunk.
Other routes' answers are FastAPI's own: the route's return type (a model of `api.responses`, or
the SDK's own type), where it has one.
"""

ERROR_MODELS: dict[str, type[BaseModel]] = {ERROR_SCHEMA: ErrorBody,
                                            OPENAI_ERROR_SCHEMA: OpenAIError}
"""What a 4xx answers: Tinker routes `ErrorBody`, the OpenAI-compatible ones `OpenAIError`."""

PROTOBUF_BODY: dict[str, Any] = {
    "required": True,
    "description": "A serialized tinker_public.ForwardBackwardRequest (tinker-api.md §8.1), "
                   "zstd-compressed when Content-Encoding is zstd.",
    "content": {PROTO_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
}

CONTENT_ENCODING_HEADER: dict[str, Any] = {
    "name": "Content-Encoding", "in": "header", "required": False,
    "schema": {"type": "string", "enum": ["identity", "zstd"]},
}


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app``'s routes, with request bodies, auth and error shapes.

    Returns:
        a JSON-ready OpenAPI 3.1 document (built anew on every call).
    """
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="A Tinker-compatible multi-tenant LoRA training and "
                                  "sampling server (loraplex).")
    components = doc.setdefault("components", {})
    found = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):  # only the 422s named them
        found.pop(unused, None)
    found.update(_body_schemas())
    components["securitySchemes"] = {
        API_KEY_SCHEME: {"type": "apiKey", "in": "header", "name": "X-API-Key"}}
    security = {_key(method, route.path_format): _security(route.dependant)
                for route in api_routes(app) for method in route.methods}
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            _complete(operation, _key(method, path), security.get(_key(method, path)))
    return doc


def _complete(operation: dict[str, Any], key: str, security: list[dict[str, Any]] | None
              ) -> None:
    """Add the body, security and error responses of one operation."""
    model = REQUEST_BODIES.get(key)
    if model is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": REF_TEMPLATE.format(model=model.__name__)}}}}
    elif key == FORWARD_BACKWARD:
        operation["requestBody"] = copy.deepcopy(PROTOBUF_BODY)
        operation.setdefault("parameters", []).append(copy.deepcopy(CONTENT_ENCODING_HEADER))
    if security is not None:
        operation["security"] = security
    responses = operation.setdefault("responses", {})
    if key in RESPONSE_BODIES:
        whole, chunk = RESPONSE_BODIES[key]
        responses["200"] = {
            "description": "The completion; with ``stream``, server-sent events of chunks "
                           "(``data: {chunk}``), ending with ``data: [DONE]``.",
            "content": {"application/json": {"schema": _ref(whole)},
                        "text/event-stream": {"schema": _ref(chunk)}}}
    responses.pop("422", None)  # schema failures are answered 400 (`api.errors`), never 422
    error = OPENAI_ERROR_SCHEMA if key.split(" ", 1)[1].startswith("/v1/") else ERROR_SCHEMA
    responses["4XX"] = {"description": "The request was refused; the body names the problem.",
                        "content": {"application/json": {"schema": {
                            "$ref": REF_TEMPLATE.format(model=error)}}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def _body_schemas() -> dict[str, Any]:
    """JSON Schemas of every request, response and error model (shared nested models once)."""
    requests = sorted(set(REQUEST_BODIES.values()), key=lambda m: m.__name__)
    answers = sorted({m for pair in RESPONSE_BODIES.values() for m in pair}
                     | set(ERROR_MODELS.values()), key=lambda m: m.__name__)
    _, top = models_json_schema([(m, "validation") for m in requests]
                                + [(m, "serialization") for m in answers],
                                ref_template=REF_TEMPLATE)
    found: dict[str, Any] = dict(top.get("$defs", {}))
    for name, model in ERROR_MODELS.items():
        found[name] = found.pop(model.__name__)
    return found


def api_routes(app: FastAPI) -> Iterator[Any]:
    """The app's documented routes as mounted: ``path_format`` (prefix included), ``methods``,
    ``endpoint``, ``dependant``. FastAPI ≥ 0.16x keeps included routers lazily
    (`fastapi.routing.iter_route_contexts` resolves them); older ones list plain APIRoutes."""
    contexts = getattr(routing, "iter_route_contexts", None)
    route: Any
    for route in (contexts(app.routes) if contexts is not None else app.routes):
        original = getattr(route, "original_route", route)
        if isinstance(original, APIRoute) and route.include_in_schema:
            yield route


def _security(dependant: Dependant) -> list[dict[str, Any]] | None:
    """The key requirement of a route: required when one of its dependencies comes from
    `api.auth` (optional for `auth.caller_if_any`), none otherwise."""
    calls = list(_calls(dependant))
    if auth.caller_if_any in calls:
        return [{API_KEY_SCHEME: []}, {}]
    if any(getattr(c, "__module__", None) == auth.__name__ for c in calls):
        return [{API_KEY_SCHEME: []}]
    return None


def _calls(dependant: Dependant) -> Iterator[object]:
    for d in dependant.dependencies:
        yield d.call
        yield from _calls(d)


def _key(method: str, path: str) -> str:
    return f"{method.upper()} {path}"
