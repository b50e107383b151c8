"""Backpressure the SDK understands, on the wire: over its in-flight limit a tenant's pending
futures answer ``try_again`` with ``queue_state: paused_rate_limit``, new samples and
non-gap-filling training ops get 429 (counted in the stats), and the gap filler is admitted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from loraplex.api.context import ServerContext
from tests.api.conftest import MODEL
from tests.api.live_server import live_server
from tests.integration.serve_fake import fake_context

KEY = "tml-backpressure"


@pytest.fixture
def quick_server(tmp_path: Path) -> Iterator[tuple[str, ServerContext]]:
    ctx = fake_context(str(tmp_path / "data"), long_poll_s=0.2)
    with live_server(ctx) as url:
        yield url, ctx
    ctx.stores.close()


def test_over_the_limit_futures_say_paused_and_submits_get_429(
    quick_server: tuple[str, ServerContext],
) -> None:
    url, ctx = quick_server
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, trust_env=False,
                      timeout=30) as http:
        session = http.post("/api/v1/create_session", json={
            "tags": [], "user_metadata": {}, "sdk_version": "test"}).json()["session_id"]
        created = http.post("/api/v1/create_model", json={
            "session_id": session, "model_seq_id": 0, "base_model": MODEL,
            "lora_config": {"rank": 4}}).json()
        model_id = created["model_id"]
        assert retrieve(http, created["request_id"])["model_id"] == model_id
        scheduler = ctx.catalog.get(MODEL).lanes.schedulers()[0][1]
        scheduler.config = replace(scheduler.config, max_inflight_per_tenant=1)

        def optim(seq: int) -> httpx.Response:
            return http.post("/api/v1/optim_step", json={
                "model_id": model_id, "seq_id": seq, "adam_params": {}})

        waiting = optim(2).json()["request_id"]  # seq 1 missing: it waits, 1 op in flight
        answer = retrieve(http, waiting)
        assert answer == {"type": "try_again", "request_id": waiting,
                          "queue_state": "paused_rate_limit"}
        sample = http.post("/api/v1/asample", json={
            "base_model": MODEL, "num_samples": 1, "type": "sample",
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [2, 3]}]},
            "sampling_params": {"max_tokens": 1}})
        assert sample.status_code == 429 and sample.headers["retry-after"] == "1"
        assert optim(3).status_code == 429
        gap_filler = optim(1)
        assert gap_filler.status_code == 200, "the op the queue waits on is always admitted"
        while (answer := retrieve(http, waiting)).get("type") == "try_again":
            pass  # the engine runs it now (long-poll is 0.2 s here)
        assert answer["type"] == "optim_step"
        stats: dict[str, Any] = http.get("/api/v1/loraplex/stats").json()
        [counters] = stats["tenants"].values()
        assert counters["rejected"] == {"Sample": 1, "OptimStep": 1}


def retrieve(http: httpx.Client, request_id: str) -> dict[str, Any]:
    response = http.post("/api/v1/retrieve_future", json={"request_id": request_id})
    assert response.status_code == 200, response.text
    return dict(response.json())
