"""REST listing (runs, checkpoints, sessions, capabilities) and tenant isolation, through the
SDK 0.38 RestClient and ServiceClient."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
import tinker
from tinker import types

from tests.api.conftest import MODEL, Server
from tests.api.test_training import ADAM, DATA

Make = Callable[..., tinker.ServiceClient]
PROMPT = types.ModelInput.from_ints([2, 3, 4])


def test_capabilities_echo_the_served_name(server: Server, new_key: Callable[[], str]) -> None:
    rest = tinker.RestClient(base_url=server.url, api_key=new_key())
    caps = rest.get_server_capabilities().result()
    assert [m.model_name for m in caps.supported_models] == [MODEL]
    info = server.ctx.catalog.get(MODEL).info
    assert caps.supported_models[0].max_context_length == info.max_context


def test_runs_checkpoints_and_sessions_are_listed(server: Server, service_client: Make,
                                                  new_key: Callable[[], str]) -> None:
    key = new_key()
    client = service_client(key)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4,
                                            user_metadata={"renderer_name": "qwen3"}).result()
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()
    state = tc.save_state("000001", ttl_seconds=7200).result().path
    sampler = tc.save_weights_for_sampler("000001").result().path
    rest = tinker.RestClient(base_url=server.url, api_key=key)

    runs = rest.list_training_runs().result()
    assert [r.training_run_id for r in runs.training_runs] == [tc.model_id]
    assert runs.cursor.total_count == 1
    run = rest.get_training_run_by_tinker_path(state).result()
    assert run.base_model == MODEL and run.lora_rank == 4 and run.is_lora
    assert run.user_metadata == {"renderer_name": "qwen3"}
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state
    assert run.last_sampler_checkpoint is not None
    assert run.last_sampler_checkpoint.tinker_path == sampler

    listed = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert {c.tinker_path for c in listed} == {state, sampler}
    by_path = {c.tinker_path: c for c in listed}
    assert by_path[state].checkpoint_type == "training" and by_path[state].size_bytes
    expires = by_path[state].expires_at
    assert expires is not None and 7000 < expires.timestamp() - time.time() <= 7200
    assert {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints} == {
        state, sampler}

    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.base_model, info.lora_rank, info.is_lora) == (MODEL, 4, True)

    rest.set_checkpoint_ttl_from_tinker_path(state, None).result()
    listed_now = {c.tinker_path: c for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
    assert listed_now[state].expires_at is None
    rest.delete_checkpoint_from_tinker_path(sampler).result()
    assert [c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints] == [
        state]

    sessions = rest.list_sessions().result().sessions
    assert len(sessions) == 1
    session = rest.get_session(sessions[0]).result()
    assert session.training_run_ids == [tc.model_id]


def test_another_tenant_gets_404_for_everything(server: Server, service_client: Make,
                                                new_key: Callable[[], str]) -> None:
    alice_key, bob_key = new_key(), new_key()
    alice = service_client(alice_key)
    bob = service_client(bob_key)
    tc = alice.create_lora_training_client(base_model=MODEL, rank=4).result()
    state = tc.save_state("private").result().path
    sampler_path = tc.save_weights_for_sampler("private").result().path
    bob_rest = tinker.RestClient(base_url=server.url, api_key=bob_key)

    with pytest.raises(tinker.NotFoundError):
        bob_rest.get_training_run(tc.model_id).result()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.list_checkpoints(tc.model_id).result()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.get_weights_info_by_tinker_path(state).result()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.delete_checkpoint_from_tinker_path(state).result()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.publish_checkpoint_from_tinker_path(state).result()
    with pytest.raises(tinker.NotFoundError):
        bob.create_training_client_from_state(state).result()
    with pytest.raises(tinker.NotFoundError):
        bob.create_sampling_client(model_path=sampler_path).result()
    assert bob_rest.list_training_runs().result().training_runs == []
    assert bob_rest.list_user_checkpoints().result().checkpoints == []
    # Bob's requests may not touch Alice's model or futures either.
    request_id = _raw_create_model(server.url, alice_key)
    raw = httpx.post(f"{server.url}/api/v1/retrieve_future", trust_env=False,
                     headers={"X-API-Key": bob_key}, json={"request_id": request_id})
    assert raw.status_code == 404 and raw.json()["error"]
    raw = httpx.post(f"{server.url}/api/v1/get_info", trust_env=False,
                     headers={"X-API-Key": bob_key}, json={"model_id": tc.model_id})
    assert raw.status_code == 404

    alice_rest = tinker.RestClient(base_url=server.url, api_key=alice_key)
    alice_rest.publish_checkpoint_from_tinker_path(state).result()
    alice_rest.publish_checkpoint_from_tinker_path(sampler_path).result()
    assert bob_rest.get_weights_info_by_tinker_path(state).result().base_model == MODEL
    copy = bob.create_training_client_from_state_with_optimizer(state).result()
    copy.forward(DATA, "cross_entropy").result()
    bob.create_sampling_client(model_path=sampler_path).result().compute_logprobs(PROMPT).result()
    assert bob_rest.get_training_run(tc.model_id, access_scope="accessible").result(
    ).training_run_id == tc.model_id
    with pytest.raises(tinker.NotFoundError):
        bob_rest.delete_checkpoint_from_tinker_path(state).result()
    alice_rest.unpublish_checkpoint_from_tinker_path(state).result()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.get_weights_info_by_tinker_path(state).result()


def _raw_create_model(url: str, key: str) -> str:
    headers = {"X-API-Key": key}
    session = httpx.post(f"{url}/api/v1/create_session", headers=headers, trust_env=False,
                         json={"tags": [], "user_metadata": {}, "sdk_version": "raw"}).json()
    body = {"session_id": session["session_id"], "model_seq_id": 0, "base_model": MODEL,
            "lora_config": {"rank": 2}}
    created = httpx.post(f"{url}/api/v1/create_model", headers=headers, trust_env=False,
                         json=body)
    return str(created.json()["request_id"])


def test_unknown_and_closed_keys(server: Server) -> None:
    ok = httpx.get(f"{server.url}/api/v1/get_server_capabilities", trust_env=False,
                   headers={"X-API-Key": "sk-not-tinker"})
    assert ok.status_code == 401 and "tml-" in ok.json()["error"]
    missing = httpx.get(f"{server.url}/api/v1/get_server_capabilities", trust_env=False)
    assert missing.status_code == 401
