"""The served OpenAPI document (`loraplex.api.openapi`): valid OpenAPI 3.1, served without a
key, and true to the routes: every body a route reads is declared, with the very SDK model the
route validates it with (read off the route's source), forward_backward as protobuf, and the
key requirement where the route authenticates."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI

from loraplex.api.app import create_app
from loraplex.api.openapi import (
    API_KEY_SCHEME,
    FORWARD_BACKWARD,
    REQUEST_BODIES,
    api_routes,
    openapi_document,
)
from tests.api.live_server import live_server
from tests.integration.serve_fake import fake_context

OPEN_ROUTES = {"GET /api/v1/healthz", "POST /api/v1/client/config",
               "POST /api/v1/client/dynamic_config", "POST /api/v1/telemetry"}


@pytest.fixture(scope="module")
def toy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ctx = fake_context(str(tmp_path_factory.mktemp("openapi-data")))
    with live_server(ctx) as url:
        yield url
    ctx.stores.close()


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return create_app(fake_context(str(tmp_path_factory.mktemp("openapi-app"))))


def _keys(app: FastAPI) -> Iterator[tuple[str, Any]]:
    for route in api_routes(app):
        for method in sorted(route.methods):
            yield f"{method} {route.path_format}", route


def _validated_models(endpoint: Any) -> tuple[bool, set[str]]:
    """Whether the endpoint reads its body, and the `schemas.*` names it (or a module-level
    function it calls or hands on, as ``submit_json(..., save_weights_op)``) validates with."""
    module = inspect.getmodule(endpoint)
    source = inspect.getsource(endpoint)
    reads_body = "request_body(" in source or "parse_body(" in source
    names = re.findall(r"\b(\w+)\(", source) + re.findall(r"[(,]\s*(\w+)\s*[,)]", source)
    called = {getattr(module, name) for name in names
              if inspect.isfunction(getattr(module, name, None))}
    sources = [source, *(inspect.getsource(f) for f in called if f is not endpoint)]
    return reads_body, {m for s in sources for m in re.findall(r"schemas\.([A-Z]\w*)", s)}


def test_the_document_is_served_without_a_key_and_is_valid_openapi(toy_url: str) -> None:
    response = httpx.get(f"{toy_url}/openapi.json", trust_env=False, timeout=30)
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.1")
    schema = schemathesis.openapi.from_dict(doc)
    schema.validate()  # the OpenAPI 3.1 meta-schema
    labels = {r.ok().label for r in schema.get_all_operations()}
    assert FORWARD_BACKWARD in labels and "POST /api/v1/asample" in labels


def test_every_body_a_route_reads_is_declared_with_the_model_it_validates(
        app: FastAPI) -> None:
    doc = openapi_document(app)
    for key, route in _keys(app):
        method, path = key.split(" ", 1)
        operation = doc["paths"][path][method.lower()]
        reads_body, validated = _validated_models(route.endpoint)
        if key in REQUEST_BODIES:
            assert validated == {REQUEST_BODIES[key].__name__}, (key, validated)
            ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{REQUEST_BODIES[key].__name__}"
            assert REQUEST_BODIES[key].__name__ in doc["components"]["schemas"]
        elif key == FORWARD_BACKWARD:
            assert "application/x-protobuf" in operation["requestBody"]["content"]
            assert {"name": "Content-Encoding", "in": "header"}.items() <= next(
                p for p in operation["parameters"] if p["name"] == "Content-Encoding").items()
        else:
            assert not reads_body, f"{key} reads a body the document does not declare"
            assert "requestBody" not in operation, key
        assert "422" not in operation["responses"], key
        assert operation["responses"]["4XX"]["content"]["application/json"]


def test_routes_that_authenticate_require_the_api_key(app: FastAPI) -> None:
    doc = openapi_document(app)
    assert doc["components"]["securitySchemes"][API_KEY_SCHEME] == {
        "type": "apiKey", "in": "header", "name": "X-API-Key"}
    num_authenticated = 0
    for key, route in _keys(app):
        method, path = key.split(" ", 1)
        security = doc["paths"][path][method.lower()].get("security")
        if "Tenant" in str(inspect.signature(route.endpoint)):
            assert security == [{API_KEY_SCHEME: []}], key
            num_authenticated += 1
        if key in OPEN_ROUTES:
            assert security is None, key
    assert num_authenticated >= 25


def test_every_reference_resolves(app: FastAPI) -> None:
    doc = openapi_document(app)
    text = repr(doc)
    for name in set(re.findall(r"#/components/schemas/([\w.-]+)", text)):
        assert name in doc["components"]["schemas"], name


def test_the_document_is_a_plain_function_of_the_app(app: FastAPI, tmp_path: Path) -> None:
    first = openapi_document(app)
    first["paths"].clear()
    assert openapi_document(app)["paths"], "no state is shared between calls"
    other = create_app(fake_context(str(tmp_path)))
    assert openapi_document(other) == openapi_document(app)
