"""Requests a hostile tenant (or an unlucky client) sends: each gets a clear 4xx before anything
is allocated, nothing of another tenant changes, and the server keeps serving. A toy server of
its own with small limits and quotas, driven over real HTTP and by the official SDK."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import tinker
import zstandard
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from loraplex.config import LimitsConfig, QuotaConfig
from tests.api.conftest import MODEL, Server
from tests.api.live_server import live_server
from tests.api.test_training import ADAM, DATA
from tests.integration.serve_fake import fake_context, seed_builtin_tiny

LIMITS = LimitsConfig(max_body_bytes=256 << 10, max_decompressed_bytes=1 << 20,
                      max_tensor_elements=1 << 16, max_request_elements=1 << 18)
QUOTAS = QuotaConfig(max_training_runs=3, max_checkpoint_bytes=20_000,
                     max_unfetched_result_bytes=4_000, max_custom_losses_per_session=2)


@pytest.fixture(scope="module")
def hard(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("hardened")
    seed_builtin_tiny(data_dir, tiny_model_dir)
    ctx = fake_context(str(data_dir), limits=LIMITS, quotas=QUOTAS)
    with live_server(ctx) as url:
        yield Server(url, ctx)
    ctx.stores.close()


@pytest.fixture
def client(hard: Server, new_key: Callable[[], str]) -> Iterator[tinker.ServiceClient]:
    made = tinker.ServiceClient(base_url=hard.url, api_key=new_key())
    yield made
    made.holder.close()


def post(server: Server, key: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {"X-API-Key": key, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.post(f"{server.url}{path}", headers=headers, trust_env=False, timeout=30,
                      **kwargs)  # type: ignore[arg-type]


def raw_model(server: Server, key: str) -> str:
    session = post(server, key, "/api/v1/create_session",
                   json={"tags": [], "user_metadata": None,
                         "sdk_version": "raw"}).json()["session_id"]
    created = post(server, key, "/api/v1/create_model",
                   json={"session_id": session, "model_seq_id": 0, "base_model": MODEL,
                         "lora_config": {"rank": 2}}).json()
    retrieve(server, key, created["request_id"])
    return str(created["model_id"])


def retrieve(server: Server, key: str, request_id: str) -> httpx.Response:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = post(server, key, "/api/v1/retrieve_future", json={"request_id": request_id})
        if not (r.headers["content-type"].startswith("application/json")
                and r.json().get("type") == "try_again"):
            return r
    raise AssertionError("future never completed")


def fwd_bwd_body(model_id: str, seq_id: int, *, tensor: pb.Tensor | None = None) -> bytes:
    msg = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = b"".join(
        t.to_bytes(4, "little") for t in (2, 3, 4))
    targets = datum.loss_fn_inputs["target_tokens"]
    targets.dtype, targets.dense = pb.DTYPE_INT64, b"".join(
        t.to_bytes(8, "little") for t in (3, 4, 5))
    targets.shape.extend([3])
    weights = datum.loss_fn_inputs["weights"]
    if tensor is not None:
        weights.CopyFrom(tensor)
    else:
        weights.dtype, weights.dense = pb.DTYPE_FLOAT32, b"\x00\x00\x80\x3f" * 3
        weights.shape.extend([3])
    return msg.SerializeToString()


PROTO = {"Content-Type": "application/x-protobuf"}


def test_a_far_future_seq_id_is_refused_at_once_and_the_model_goes_on(
        hard: Server, new_key: Callable[[], str]) -> None:
    key = new_key()
    model_id = raw_model(hard, key)
    far = post(hard, key, "/api/v1/optim_step",
               json={"model_id": model_id, "seq_id": 2**63,
                     "adam_params": {"learning_rate": 1e-3}})
    assert far.status_code == 400 and far.json()["field"] == "seq_id"
    assert "past the next expected seq_id 1" in far.json()["error"]
    ok = post(hard, key, "/api/v1/forward_backward", headers=PROTO,
              content=fwd_bwd_body(model_id, 1))
    assert ok.status_code == 200 and retrieve(hard, key, ok.json()["request_id"]).status_code


def test_a_tiny_request_declaring_a_huge_sparse_tensor_is_refused_before_allocating(
        hard: Server, new_key: Callable[[], str]) -> None:
    key = new_key()
    model_id = raw_model(hard, key)
    sparse = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[1, 10**8])
    sparse.sparse_csr.crow_indices = (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    sparse.sparse_csr.col_indices = (5).to_bytes(8, "little")
    sparse.sparse_csr.values = b"\x00\x00\x80\x3f"
    body = fwd_bwd_body(model_id, 1, tensor=sparse)
    assert len(body) < 200
    started = time.monotonic()
    r = post(hard, key, "/api/v1/forward_backward", headers=PROTO, content=body)
    assert r.status_code == 200, "the address is valid: the request keeps its seq slot"
    failed = retrieve(hard, key, r.json()["request_id"]).json()
    assert failed["category"] == "user" and "max_tensor_elements" in failed["error"]
    assert "weights.shape" in failed["error"] and time.monotonic() - started < 5
    for dims, field in (([-1, 3], "shape"), ([3], "dtype")):
        bad = pb.Tensor(dtype=pb.DTYPE_FLOAT32 if field == "shape" else 77, shape=dims)
        r = post(hard, key, "/api/v1/forward_backward", headers=PROTO,
                 content=fwd_bwd_body(model_id, 2 if field == "shape" else 3, tensor=bad))
        assert f"weights.{field}" in retrieve(hard, key, r.json()["request_id"]).json()["error"]


def test_many_sparse_tensors_within_the_per_tensor_bound_are_refused_together(
        hard: Server, new_key: Callable[[], str]) -> None:
    """Each tensor within ``max_tensor_elements``, 8 of them over ``max_request_elements``:
    a few hundred bytes used to expand into gigabytes (0.9-1.15 GB from 471-790 bytes)."""
    key = new_key()
    model_id = raw_model(hard, key)
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(fwd_bwd_body(model_id, 1))
    for n in range(8):
        t = msg.data[0].loss_fn_inputs[f"extra{n}"]
        t.dtype = pb.DTYPE_FLOAT32
        t.shape.extend([1, 1 << 16])
        t.sparse_csr.crow_indices = (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
        t.sparse_csr.col_indices = (5).to_bytes(8, "little")
        t.sparse_csr.values = b"\x00\x00\x80\x3f"
    body = msg.SerializeToString()
    assert len(body) < 1000
    r = post(hard, key, "/api/v1/forward_backward", headers=PROTO, content=body)
    failed = retrieve(hard, key, r.json()["request_id"]).json()
    assert failed["category"] == "user" and "max_request_elements" in failed["error"]
    assert "data[0].loss_fn_inputs.extra4.shape" in failed["error"], "the 5th of 2^16 crosses 2^18"


def test_oversized_bodies_and_zstd_bombs_get_413(hard: Server, new_key: Callable[[], str]
                                                 ) -> None:
    key = new_key()
    model_id = raw_model(hard, key)
    big = post(hard, key, "/api/v1/forward_backward", headers=PROTO,
               content=b"\x00" * (LIMITS.max_body_bytes + 1))
    assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * (64 << 20))
    assert len(bomb) < LIMITS.max_body_bytes
    inflated = post(hard, key, "/api/v1/forward_backward", content=bomb,
                    headers={**PROTO, "Content-Encoding": "zstd"})
    assert inflated.status_code == 413 and "max_decompressed_bytes" in inflated.json()["error"]
    telemetry = httpx.post(f"{hard.url}/api/v1/telemetry", content=b"x" * (1 << 20),
                           trust_env=False)
    assert telemetry.status_code == 413
    ok = post(hard, key, "/api/v1/forward_backward", headers=PROTO,
              content=fwd_bwd_body(model_id, 1))
    assert ok.status_code == 200


def test_bad_small_values_get_400s_naming_the_field(hard: Server, new_key: Callable[[], str]
                                                   ) -> None:
    key = new_key()
    session = post(hard, key, "/api/v1/create_session",
                   json={"tags": [], "user_metadata": None,
                         "sdk_version": "raw"}).json()["session_id"]
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/api/v1/optim_step", "/api/v1/save_weights", "/api/v1/create_model"):
        r = post(hard, key, path, content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.text)
    cases = [
        ("/api/v1/create_model", {"session_id": session, "model_seq_id": 0, "base_model": MODEL,
                                  "lora_config": {"rank": 2, "seed": 2**70}},
         "lora_config.seed"),
        ("/api/v1/create_model", {"session_id": session, "model_seq_id": -1,
                                  "base_model": MODEL, "lora_config": {"rank": 2}},
         "model_seq_id"),
    ]
    for path, payload, field in cases:
        r = post(hard, key, path, json=payload)
        assert r.status_code == 400 and r.json()["field"] == field, r.text
    headers = {"X-API-Key": key}
    for query, field in (("training_runs?limit=9223372036854775808", "limit"),
                         ("checkpoints?offset=9223372036854775807", "offset"),
                         ("loraplex/usage?since=nan", "since")):
        r = httpx.get(f"{hard.url}/api/v1/{query}", headers=headers, trust_env=False)
        assert r.status_code == 400 and r.json()["field"] == field, (query, r.text)
    sig = httpx.get(f"{hard.url}/api/v1/archives/r/weights/x.tar?t=a&expires=9999999999"
                    "&sig=%C3%A9", trust_env=False)
    assert sig.status_code == 404


def test_a_checkpoint_name_is_limited_in_bytes(client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(base_model=MODEL, rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match="bytes of UTF-8"):
        tc.save_state("é" * 150).result()  # 150 characters, 300 bytes
    tc.save_state("ok").result()


def test_revoked_publication_stops_other_tenants_samplers_and_download_urls(
        hard: Server, new_key: Callable[[], str]) -> None:
    owner = tinker.ServiceClient(base_url=hard.url, api_key=new_key())
    reader_key = new_key()
    reader = tinker.ServiceClient(base_url=hard.url, api_key=reader_key)
    try:
        tc = owner.create_lora_training_client(base_model=MODEL, rank=2).result()
        tc.forward_backward(DATA, "cross_entropy").result()
        tc.optim_step(ADAM).result()
        path = tc.save_weights_for_sampler("shared").result().path
        rest = owner.create_rest_client()
        rest.publish_checkpoint_from_tinker_path(path).result()
        sampler = reader.create_sampling_client(model_path=path)
        prompt = types.ModelInput.from_ints([2, 3, 4])
        params = types.SamplingParams(max_tokens=2, seed=1)
        sampler.sample(prompt, 1, params).result()
        run_id, kind, name = path.removeprefix("tinker://").split("/")
        archive_url = httpx.get(
            f"{hard.url}/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/archive",
            headers={"X-API-Key": reader_key}, trust_env=False).json()["url"]
        assert httpx.get(archive_url, trust_env=False).status_code == 200
        rest.unpublish_checkpoint_from_tinker_path(path).result()
        with pytest.raises(tinker.NotFoundError):
            sampler.sample(prompt, 1, params).result()
        assert httpx.get(archive_url, trust_env=False).status_code == 404
        owner_sampler = tc.create_sampling_client(path)
        owner_sampler.sample(prompt, 1, params).result()  # the owner still may
        rest.delete_checkpoint_from_tinker_path(path).result()
        with pytest.raises(tinker.NotFoundError):
            owner_sampler.sample(prompt, 1, params).result()
    finally:
        owner.holder.close()
        reader.holder.close()


def test_quotas_refuse_clearly_and_show_in_usage(hard: Server, new_key: Callable[[], str]
                                                 ) -> None:
    key = new_key()
    client = tinker.ServiceClient(base_url=hard.url, api_key=key)
    try:
        runs = [client.create_lora_training_client(base_model=MODEL, rank=2).result()
                for _ in range(QUOTAS.max_training_runs)]
        with pytest.raises(tinker.PermissionDeniedError, match="quota 3"):
            client.create_lora_training_client(base_model=MODEL, rank=2).result()
        tc = runs[0]
        for i in range(100):  # toy checkpoints are a few hundred bytes: 20 KB holds dozens
            try:
                tc.save_state(f"c{i}").result()
            except tinker.RequestFailedError as exc:
                assert "quota" in str(exc) and exc.category == types.RequestErrorCategory.User
                break
        else:
            pytest.fail("the checkpoint quota never refused a save")
        usage = httpx.get(f"{hard.url}/api/v1/loraplex/usage", headers={"X-API-Key": key},
                          trust_env=False).json()
        quotas = usage["quotas"]
        assert quotas["training_runs"] == {"used": 3, "limit": QUOTAS.max_training_runs}
        assert quotas["checkpoint_bytes"]["used"] >= QUOTAS.max_checkpoint_bytes
        assert set(quotas) >= {"inflight_ops", "unfetched_result_bytes"}
    finally:
        client.holder.close()


def test_unfetched_results_count_against_a_quota(hard: Server, new_key: Callable[[], str]
                                                 ) -> None:
    key = new_key()
    model_id = raw_model(hard, key)
    statuses = []
    for seq in range(1, 40):  # each unfetched result holds ~300 bytes; the quota is 4,000
        r = post(hard, key, "/api/v1/forward_backward", headers=PROTO,
                 content=fwd_bwd_body(model_id, seq))
        statuses.append(r.status_code)
        if r.status_code == 429:
            break
        time.sleep(0.05)
    assert statuses[-1] == 429 and "not fetched" in r.json()["error"]


def test_tenants_see_only_their_own_ids_in_stats(hard: Server, new_key: Callable[[], str]
                                                 ) -> None:
    alice, bob = new_key(), new_key()
    for key in (alice, bob):
        raw_model(hard, key)
    view = httpx.get(f"{hard.url}/api/v1/loraplex/stats?recent=4096",
                     headers={"X-API-Key": alice}, trust_env=False).json()
    text = json.dumps(view)
    bob_tenant = hard.ctx.stores.keys.tenant_for(bob, open_access=True)
    alice_tenant = hard.ctx.stores.keys.tenant_for(alice, open_access=True)
    assert bob_tenant not in text and alice_tenant in view["tenants"]
    operator = hard.ctx.stores.keys.create("ops", operator=True)
    full = httpx.get(f"{hard.url}/api/v1/loraplex/stats?recent=4096",
                     headers={"X-API-Key": operator}, trust_env=False).json()
    assert {alice_tenant, bob_tenant} <= set(full["tenants"])


def test_a_revoked_key_stops_working_within_the_cache_ttl(hard: Server) -> None:
    key = hard.ctx.stores.keys.create("leaver")
    headers = {"X-API-Key": key}
    url = f"{hard.url}/api/v1/get_server_capabilities"
    assert httpx.get(url, headers=headers, trust_env=False).status_code == 200
    assert hard.ctx.stores.keys.revoke("leaver") == 1
    deadline = time.monotonic() + hard.ctx.config.key_cache_ttl_s + 5
    while httpx.get(url, headers=headers, trust_env=False).status_code == 200:
        assert time.monotonic() < deadline, "the revoked key kept working"
        time.sleep(0.2)
    refused = httpx.get(url, headers=headers, trust_env=False)  # open mode included
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]


def test_a_500_keeps_the_keep_alive_connection(hard: Server, new_key: Callable[[], str]
                                               ) -> None:
    """An internal error answers 500 with an error id and the same connection serves the
    next request (the database of this server is closed for one request to force it)."""
    key = new_key()
    host, port = urlsplit(hard.url).hostname, urlsplit(hard.url).port
    db = hard.ctx.stores.db
    with socket.create_connection((host, port), timeout=10) as conn:
        real_query = db.query_one

        def broken(*args: object, **kwargs: object) -> object:
            raise RuntimeError("simulated store failure")

        db.query_one = broken  # type: ignore[method-assign]
        try:
            first = _http(conn, "/api/v1/sessions/nope", key)
        finally:
            db.query_one = real_query  # type: ignore[method-assign]
        second = _http(conn, "/api/v1/healthz", key)
    assert first.startswith("HTTP/1.1 500") and "error id" in first
    assert second.startswith("HTTP/1.1 200"), second


def _http(conn: socket.socket, path: str, key: str) -> str:
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    return (head + b"\r\n\r\n" + body).decode()


def test_stored_custom_losses_per_session_are_bounded(hard: Server,
                                                      new_key: Callable[[], str]) -> None:
    """Uploaded losses were unlimited per session (~14 GiB of SQLite an hour per tenant): the
    third of a session is a 403 naming the quota; a retry of a stored one still answers."""

    def scaled_nll(scale: float) -> Callable[..., Any]:
        def nll(logprobs, weights):  # type: ignore[no-untyped-def]
            loss = -(logprobs * weights).sum() * scale
            return loss, {"custom/nll:sum": loss}
        return nll

    key, ranks = new_key(), {"logprobs": 1, "weights": 1}
    client = tinker.ServiceClient(base_url=hard.url, api_key=key)
    try:
        first = client.create_custom_loss(scaled_nll(1.0), ranks).result()
        client.create_custom_loss(scaled_nll(2.0), ranks).result()
        with pytest.raises(tinker.APIStatusError, match="max_custom_losses_per_session") as no:
            client.create_custom_loss(scaled_nll(3.0), ranks).result()
        assert no.value.status_code == 403
        session = client.holder.get_session_id()
        stored = next(iter(hard.ctx.stores.db.query(
            "SELECT * FROM custom_losses WHERE loss_id = ?", (first.loss_id,))))
        retry = {"session_id": session, "custom_loss_seq_id": int(first.loss_id.rsplit(":")[-1]),
                 "name": stored["name"],
                 "inputs": [{"name": n, "rank": r} for n, r in json.loads(stored["inputs"])],
                 "graph": {"nodes": json.loads(stored["nodes"])}, "type": "create_custom_loss"}
        again = post(hard, key, "/api/v1/create_custom_loss", json=retry)
        assert again.status_code == 200, again.text
    finally:
        client.holder.close()
