"""retrieve_futures and join_sampling_session as SDK 0.38 uses them (both switched on in client
config): the SDK's session poller completes many concurrent samples, an unpickled
SamplingClient joins with a fresh clone id, and the wire contract (cursor, acknowledgement,
timeout 0, another tenant's session) is checked with a plain HTTP client."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import httpx
import tinker
from tinker import types

from tests.api.conftest import MODEL, Server

Make = Callable[..., tinker.ServiceClient]
PROMPT = types.ModelInput.from_ints([2, 3, 4, 5])
PARAMS = types.SamplingParams(max_tokens=3, seed=1)


def post(server: Server, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/{path}", json=body, headers={"X-API-Key": key},
                      trust_env=False, timeout=60)


def test_client_config_switches_the_session_features_on(server: Server) -> None:
    config = httpx.post(f"{server.url}/api/v1/client/config", json={}, trust_env=False).json()
    assert config["sample_use_retrieve_futures"] is True
    assert config["sample_join_sampling_session"] is True
    assert config["custom_loss_server_side"] is True


def test_the_sdk_poller_completes_concurrent_samples(service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    futures: list[Future[types.SampleResponse]] = [
        sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=3, seed=i)) for i in range(24)]
    outs = [f.result(timeout=120) for f in futures]
    assert sampler._futures_poller is not None, "the samples waited on the session poller"
    assert all(len(o.sequences[0].tokens) >= 1 for o in outs)
    again = sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=3, seed=5)).result()
    assert again.sequences[0].tokens == outs[5].sequences[0].tokens


def test_an_unpickled_sampler_joins_with_a_new_clone_id(server: Server,
                                                        service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    original = sampler.sample(PROMPT, 1, PARAMS).result()
    copies = [pickle.loads(pickle.dumps(sampler)) for _ in range(2)]
    outs = [c.sample(PROMPT, 1, PARAMS).result() for c in copies]
    assert [o.sequences[0].tokens for o in outs] == [original.sequences[0].tokens] * 2
    assert sorted(c._cloned_sampler_id for c in copies) == [1, 2]


def test_retrieve_futures_wire_contract(server: Server, service_client: Make,
                                        new_key: Callable[[], str]) -> None:
    key = new_key()
    sampler = service_client(key).create_sampling_client(base_model=MODEL).result()
    sid = sampler._sampling_session_id
    submitted = []
    for seq_id in (7, 8):
        answer = post(server, key, "asample", {
            "sampling_session_id": sid, "seq_id": seq_id, "num_samples": 1,
            "prompt": PROMPT.model_dump(mode="json"),
            "sampling_params": PARAMS.model_dump(mode="json")}).json()
        submitted.append(answer["request_id"])
    for request_id in submitted:  # long-polls until done: the feed then holds both
        result = post(server, key, "retrieve_future", {"request_id": request_id})
        assert result.status_code == 200 and result.content
    target = {"type": "sampling_session", "sampling_session_id": sid, "cloned_sampler_id": 0}
    reply = httpx.post(f"{server.url}/api/v1/retrieve_futures", headers={"X-API-Key": key},
                       json={"target": target, "prev_cursor": 0, "timeout": 20},
                       trust_env=False, timeout=10).json()  # answers at once: events wait
    assert sorted(c["request_id"] for c in reply["completions"]) == sorted(submitted)
    assert {c["state"] for c in reply["completions"]} == {"finished"}
    cursor = reply["cursor"]
    assert cursor == 2
    idle = post(server, key, "retrieve_futures", {"target": target, "prev_cursor": cursor,
                                                  "timeout": 0}).json()
    assert idle == {"completions": [], "cursor": cursor}, "acknowledged events are gone"
    later = post(server, key, "asample", {
        "sampling_session_id": sid, "seq_id": 9, "num_samples": 1,
        "prompt": PROMPT.model_dump(mode="json"),
        "sampling_params": PARAMS.model_dump(mode="json")}).json()["request_id"]
    woken = post(server, key, "retrieve_futures", {"target": target, "prev_cursor": cursor,
                                                   "timeout": 20}).json()  # waits, then wakes
    assert [c["request_id"] for c in woken["completions"]] == [later]
    assert woken["cursor"] == 3
    other = new_key()
    assert post(server, other, "retrieve_futures", {"target": target}).status_code == 404
    assert post(server, other, "join_sampling_session",
                {"sampling_session_id": sid}).status_code == 404
