"""The stats, REST and dashboard routes' response models (`loraplex.api.responses`, and the
SDK's own types where they serialise alike): ``/openapi.json`` documents each route's answer
with its model, and real answers after SDK traffic validate against the model and are exactly
what the model sends back (so no key the route sends is missing from its model)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import tinker
from pydantic import BaseModel
from tinker import types as sdk

from loraplex.api.app import create_app
from loraplex.api.openapi import openapi_document
from loraplex.api.responses import (
    client,
    cycles,
    evals,
    operator_view,
    run_metrics,
    sampling_sessions,
    stats,
    tenant_view,
    training_run_info,
    training_runs,
    usage,
)
from loraplex.domain.usage import TOKEN_TYPES
from tests.api.conftest import Server
from tests.api.test_dashboard import train
from tests.integration.serve_fake import fake_context

Make = Callable[..., tinker.ServiceClient]

DOCUMENTED: dict[str, type[BaseModel]] = {
    "GET /api/v1/loraplex/stats": stats.Stats,
    "GET /api/v1/training_runs": training_runs.TrainingRunsResponse,
    "GET /api/v1/training_runs/{run_id}": training_runs.TrainingRun,
    "GET /api/v1/training_runs/{run_id}/checkpoints": training_runs.CheckpointsListResponse,
    "GET /api/v1/checkpoints": training_runs.CheckpointsListResponse,
    "GET /api/v1/loraplex/dashboard/tenant": tenant_view.TenantView,
    "GET /api/v1/loraplex/dashboard/operator": operator_view.OperatorView,
    "GET /api/v1/loraplex/training_runs/{model_id}/metrics": run_metrics.RunMetrics,
    "GET /api/v1/loraplex/usage": usage.UsageView,
    "GET /api/v1/loraplex/cycles": cycles.CyclesResponse,
    "POST /api/v1/loraplex/evals": evals.StoredEvalScores,
    "GET /api/v1/loraplex/evals": evals.EvalScoresResponse,
    "POST /api/v1/retrieve_futures": sampling_sessions.FuturesRetrieveResponse,
    "POST /api/v1/join_sampling_session": sdk.JoinSamplingSessionResponse,
    "POST /api/v1/create_session": sdk.CreateSessionResponse,
    "POST /api/v1/session_heartbeat": sdk.SessionHeartbeatResponse,
    "GET /api/v1/sessions": sdk.ListSessionsResponse,
    "GET /api/v1/sessions/{session_id}": sdk.GetSessionResponse,
    "POST /api/v1/create_model": sdk.UntypedAPIFuture,
    "POST /api/v1/get_info": training_run_info.GetInfoResponse,
    "POST /api/v1/client/dynamic_config": client.DynamicConfig,
    "GET /api/v1/healthz": client.Health,
    "GET /api/v1/get_server_capabilities": sdk.GetServerCapabilitiesResponse,
}


def test_each_route_documents_its_answer_with_its_model(tmp_path_factory: pytest.TempPathFactory
                                                         ) -> None:
    doc = openapi_document(create_app(fake_context(str(tmp_path_factory.mktemp("doc")))))
    components = doc["components"]["schemas"]
    for key, model in DOCUMENTED.items():
        method, path = key.split(" ", 1)
        answer = doc["paths"][path][method.lower()]["responses"]["200"]
        schema = answer["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}, key
        assert set(components[model.__name__]["properties"]) == set(model.model_fields), key


def test_tenant_counters_name_every_token_type() -> None:
    fields = set(stats.TenantCounters.model_fields)
    assert {f"{t}_tokens" for t in TOKEN_TYPES} <= fields


def _same_as_model(model: type[BaseModel], response: httpx.Response) -> BaseModel:
    """``response`` validates against ``model``, and the model sends it back unchanged (same
    keys in the same order: nothing the route sends is outside the model)."""
    assert response.status_code == 200, response.text
    parsed = model.model_validate_json(response.content)
    again = parsed.model_dump(mode="json", exclude_unset=True)
    assert json.dumps(again) == json.dumps(response.json()), model.__name__
    return parsed


def test_real_answers_validate_against_their_models(
        server: Server, service_client: Make, new_key: Callable[[], str]) -> None:
    key = new_key()
    tc, _ = train(service_client, key, 2)
    path = tc.save_state("ckpt-models").result().path
    tc.save_weights_and_get_sampling_client("w-models")
    operator = server.ctx.stores.keys.create("models-operator", operator=True)
    run = tc.model_id
    kind, name = path.split("/")[-2:]

    def call(method: str, url: str, api_key: str = key, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{server.url}{url}", headers={"X-API-Key": api_key},
                             trust_env=False, timeout=30, **kwargs)

    assert call("PUT", f"/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/ttl",
                json={"ttl_seconds": 3600}).status_code == 204
    scores = {"path": path, "scores": [{"task": "t", "metric": "m", "value": 0.5},
                                       {"task": "u", "metric": "m", "value": 1,
                                        "stderr": 0.1, "num_samples": 3}]}
    _same_as_model(evals.StoredEvalScores, call("POST", "/api/v1/loraplex/evals", json=scores))
    _same_as_model(evals.EvalScoresResponse,
                   call("GET", "/api/v1/loraplex/evals", params={"path": path}))
    for api_key in (key, operator):
        for recent in (0, 50):
            body = _same_as_model(stats.Stats, call("GET", "/api/v1/loraplex/stats", api_key,
                                                    params={"recent": recent}))
            assert isinstance(body, stats.Stats) and body.workers and body.schedulers
    listed = _same_as_model(training_runs.TrainingRunsResponse,
                            call("GET", "/api/v1/training_runs"))
    # The SDK's own types parse them too (and its checkpoints keep our extra key out).
    sdk.TrainingRunsResponse.model_validate_json(call("GET", "/api/v1/training_runs").content)
    assert isinstance(listed, training_runs.TrainingRunsResponse)
    [mine] = listed.training_runs
    assert mine.last_checkpoint is not None and mine.last_checkpoint.expires_at is not None
    assert mine.last_checkpoint.time.endswith("Z")
    _same_as_model(training_runs.TrainingRun, call("GET", f"/api/v1/training_runs/{run}"))
    for url in (f"/api/v1/training_runs/{run}/checkpoints", "/api/v1/checkpoints"):
        _same_as_model(training_runs.CheckpointsListResponse, call("GET", url))
        sdk.CheckpointsListResponse.model_validate_json(call("GET", url).content)
    _same_as_model(tenant_view.TenantView, call("GET", "/api/v1/loraplex/dashboard/tenant"))
    _same_as_model(operator_view.OperatorView,
                   call("GET", "/api/v1/loraplex/dashboard/operator", operator))
    for max_points in (1, 2000):  # bucketed (with min / max) and one point per step
        _same_as_model(run_metrics.RunMetrics,
                       call("GET", f"/api/v1/loraplex/training_runs/{run}/metrics",
                            params={"max_points": max_points}))
    _same_as_model(usage.UsageView, call("GET", "/api/v1/loraplex/usage"))
    _same_as_model(cycles.CyclesResponse, call("GET", "/api/v1/loraplex/cycles", operator))
    sessions = _same_as_model(sdk.ListSessionsResponse, call("GET", "/api/v1/sessions"))
    assert isinstance(sessions, sdk.ListSessionsResponse)
    _same_as_model(sdk.GetSessionResponse,
                   call("GET", f"/api/v1/sessions/{sessions.sessions[0]}"))
    _same_as_model(training_run_info.GetInfoResponse,
                   call("POST", "/api/v1/get_info", json={"model_id": run}))
    _same_as_model(client.DynamicConfig, call("POST", "/api/v1/client/dynamic_config"))
    _same_as_model(client.Health, call("GET", "/api/v1/healthz"))
    _same_as_model(sdk.GetServerCapabilitiesResponse,
                   call("GET", "/api/v1/get_server_capabilities"))
