"""The fuzzing tenant's own live state, made over plain HTTP before the fuzzing starts.

Random strings rarely name a real session, model or checkpoint, so the fuzzers also aim at
these (the deeper paths: seq slots, op builders, checkpoint access) and at the concurrent
trainer's ids (with the fuzzer's own key: each must be refused without touching the trainer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tests.fuzz.trainer import MODEL, new_key

CHECKPOINT_NAME = "fuzz-ckpt"


@dataclass
class FuzzTenant:
    """Ids of the fuzzer's tenant; ``next_seq`` is its model's next free seq_id."""

    url: str
    key: str
    session_id: str
    model_id: str
    checkpoint_path: str
    sampler_id: str
    next_seq: int
    accepted: dict[str, Callable[[], str]] = field(default_factory=dict)  # id → repro

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.key}


def wait_result(http: httpx.Client, request_id: str) -> dict:
    """The future's result once complete (asserting it is not an error)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result = http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
        if result.get("type") != "try_again":
            assert "error" not in result, result
            return result
    raise AssertionError(f"future {request_id} did not complete")


def make_fuzz_tenant(url: str) -> FuzzTenant:
    """A session, a rank-4 model on it (seq 0), one saved checkpoint (seq 1) and a sampling
    session on the base model."""
    key = new_key("fuzzer")
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=60,
                      trust_env=False) as http:
        session = http.post("/api/v1/create_session", json={
            "tags": [], "user_metadata": None, "sdk_version": "0.38.0",
            "type": "create_session"}).json()
        created = http.post("/api/v1/create_model", json={
            "session_id": session["session_id"], "model_seq_id": 0, "base_model": MODEL,
            "lora_config": {"rank": 4, "seed": 1}, "type": "create_model"}).json()
        wait_result(http, created["request_id"])
        model_id = created["model_id"]
        saved = http.post("/api/v1/save_weights", json={
            "model_id": model_id, "seq_id": 1, "path": CHECKPOINT_NAME,
            "type": "save_weights"}).json()
        path = wait_result(http, saved["request_id"])["path"]
        sampler = http.post("/api/v1/create_sampling_session", json={
            "session_id": session["session_id"], "sampling_session_seq_id": 0,
            "base_model": MODEL, "type": "create_sampling_session"}).json()
    return FuzzTenant(url, key, session["session_id"], model_id, path,
                      sampler["sampling_session_id"], next_seq=2)
