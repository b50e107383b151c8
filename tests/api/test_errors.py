"""Malformed requests get a 4xx or a user-category failed future naming the field; engine bugs
get a server error with an id; in every case the same client continues."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
import tinker
import zstandard
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from tests.api.conftest import MODEL, Server, toy_only
from tests.api.test_training import ADAM, DATA, datum

Make = Callable[..., tinker.ServiceClient]


def user_failure(future: object, match: str) -> tinker.RequestFailedError:
    with pytest.raises(tinker.RequestFailedError, match=match) as info:
        future.result()  # type: ignore[attr-defined]
    assert info.value.category == types.RequestErrorCategory.User
    return info.value


@pytest.fixture
def trainer(service_client: Make) -> tinker.TrainingClient:
    return service_client().create_lora_training_client(base_model=MODEL, rank=4).result()


def test_bad_training_inputs_fail_their_future_and_the_client_continues(
    server: Server, trainer: tinker.TrainingClient,
) -> None:
    vocab = server.ctx.catalog.get(MODEL).info.vocab_size
    out_of_vocab = [datum([2, 3, vocab])]
    user_failure(trainer.forward_backward(out_of_vocab, "cross_entropy"),
                 rf"data\[0\]\.model_input\[2\].*{vocab}.*vocabulary")
    misaligned = [types.Datum(model_input=types.ModelInput.from_ints([2, 3, 4]),
                              loss_fn_inputs={"target_tokens": [3, 4, 5], "weights": [1.0]})]
    user_failure(trainer.forward_backward(misaligned, "cross_entropy"),
                 r"data\[0\]\.loss_fn_inputs\.weights.*aligned")
    non_finite = [datum([2, 3, 4], weight=float("nan"))]
    user_failure(trainer.forward_backward(non_finite, "cross_entropy"),
                 r"data\[0\]\.loss_fn_inputs\.weights\[0\].*non-finite")
    user_failure(trainer.forward_backward(DATA, "custom"), r"loss_fn_config: a custom loss")
    user_failure(trainer.forward_backward(DATA, "no_such_loss"), r"loss_fn.*'no_such_loss'")
    user_failure(trainer.optim_step(types.AdamParams(learning_rate=-1.0)),
                 r"adam_params\.learning_rate")
    image = types.Datum(
        model_input=types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png",
                                                              expected_tokens=2)]),
        loss_fn_inputs={"target_tokens": [1, 2], "weights": [1.0, 1.0]})
    user_failure(trainer.forward_backward([image], "cross_entropy"),
                 r"data\[0\]\.model_input\.chunks\[0\].*image")
    # The failed ops kept their seq slots: the client's later ops run normally.
    trainer.forward_backward(DATA, "cross_entropy").result()
    trainer.optim_step(ADAM).result()


def test_bad_creation_requests(service_client: Make) -> None:
    client = service_client()
    with pytest.raises(tinker.BadRequestError, match=r"base_model.*unknown base model"):
        client.create_lora_training_client(base_model="nobody/nothing", rank=4).result()
    user_failure(client.create_lora_training_client(base_model=MODEL, rank=1000),
                 r"lora_config\.rank.*exceeds")
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        client.create_training_client_from_state(
            "tinker://nobody:train:0/weights/none").result()
    with pytest.raises(tinker.BadRequestError, match="model_path"):
        client.create_sampling_client(model_path="tinker://x/bogus_kind/y").result()
    client.create_lora_training_client(base_model=MODEL, rank=4).result()


def test_undecodable_and_compressed_protobuf(server: Server, new_key: Callable[[], str]
                                             ) -> None:
    key = new_key()
    headers = {"X-API-Key": key}
    session = httpx.post(f"{server.url}/api/v1/create_session", headers=headers,
                         trust_env=False, json={"tags": [], "user_metadata": None,
                                               "sdk_version": "raw"}).json()["session_id"]
    created = httpx.post(f"{server.url}/api/v1/create_model", headers=headers, trust_env=False,
                         json={"session_id": session, "model_seq_id": 0, "base_model": MODEL,
                               "lora_config": {"rank": 2}}).json()
    model_id = created["model_id"]
    _retrieve(server.url, key, created["request_id"])

    proto = {**headers, "Content-Type": "application/x-protobuf"}
    garbage = httpx.post(f"{server.url}/api/v1/forward_backward", headers=proto,
                         content=b"\xff\xff\xff not protobuf", trust_env=False)
    assert garbage.status_code == 400 and garbage.json()["field"] == "body"
    bad_zstd = httpx.post(f"{server.url}/api/v1/forward_backward", trust_env=False,
                          headers={**proto, "Content-Encoding": "zstd"}, content=b"nope")
    assert bad_zstd.status_code == 400 and "zstd" in bad_zstd.json()["error"]

    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=DATA, loss_fn="cross_entropy"),
        model_id=model_id, seq_id=1)
    body = zstandard.ZstdCompressor().compress(
        forward_backward_request_to_proto(request).SerializeToString())
    ok = httpx.post(f"{server.url}/api/v1/forward_backward", content=body, trust_env=False,
                    headers={**proto, "Content-Encoding": "zstd"})
    assert ok.status_code == 200
    result = _retrieve(server.url, key, ok.json()["request_id"])
    assert result.headers["content-type"] == "application/x-protobuf"

    for url, payload in [("/api/v1/optim_step", {"model_id": model_id}),
                         ("/api/v1/create_model", {"session_id": session}),
                         ("/api/v1/asample", {"prompt": "nope"})]:
        bad = httpx.post(f"{server.url}{url}", headers=headers, json=payload, trust_env=False)
        assert 400 <= bad.status_code < 500 and bad.json()["error"], (url, bad.text)


def _retrieve(url: str, key: str, request_id: str) -> httpx.Response:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = httpx.post(f"{url}/api/v1/retrieve_future", headers={"X-API-Key": key},
                       json={"request_id": request_id}, trust_env=False, timeout=60)
        if not (r.headers["content-type"].startswith("application/json")
                and r.json().get("type") == "try_again"):
            return r
    raise AssertionError("future never completed")


@toy_only
def test_engine_bug_is_a_server_error_with_an_id_and_the_server_goes_on(
    server: Server, trainer: tinker.TrainingClient
) -> None:
    server.toy.bug_token = 13
    try:
        with pytest.raises(tinker.RequestFailedError, match=r"error id [0-9a-f]{12}") as info:
            trainer.forward_backward([datum([13, 2, 3])], "cross_entropy").result()
        assert info.value.category == types.RequestErrorCategory.Server
        assert "Traceback" not in info.value.message and "toy engine" not in info.value.message
    finally:
        server.toy.bug_token = None
    trainer.forward_backward(DATA, "cross_entropy").result()


def test_a_finished_session_is_terminal(server: Server, service_client: Make,
                                       new_key: Callable[[], str]) -> None:
    key = new_key()
    client = service_client(key)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    client.close("success").result()  # the SDK refuses further calls; the server must too
    session = tc.model_id.split(":")[0]
    headers = {"X-API-Key": key}
    created = httpx.post(f"{server.url}/api/v1/create_model", headers=headers, trust_env=False,
                         json={"session_id": session, "model_seq_id": 5, "base_model": MODEL,
                               "lora_config": {"rank": 2}})
    assert created.status_code == 400 and "finished" in created.json()["error"]
    step = httpx.post(f"{server.url}/api/v1/optim_step", headers=headers, trust_env=False,
                      json={"model_id": tc.model_id, "seq_id": 1, "adam_params": {}})
    assert step.status_code == 400 and "no live state" in step.json()["error"]
