"""Persistence across a server restart on the same data dir: runs and checkpoints stay listed,
resuming with optimizer state is exact, expired TTLs delete files, interrupted requests fail
clearly, and a run's lost in-memory state is reported by name."""

from __future__ import annotations

import os
import time

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from loraplex.config import DEFAULT_MODEL_NAME as MODEL
from tests.api.test_training import ADAM, DATA, logprobs
from tests.integration.conftest import ServerProcess


def _step(tc: tinker.TrainingClient) -> None:
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()


@pytest.mark.slow
def test_restart_keeps_runs_and_checkpoints_and_resumes_exactly(
    server_process: ServerProcess,
) -> None:
    key = "tml-restart-owner"
    client = tinker.ServiceClient(base_url=server_process.url, api_key=key)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    _step(tc)
    _step(tc)
    state = tc.save_state("c1").result().path
    short = tc.save_state("short-lived", ttl_seconds=1).result().path
    _step(tc)
    never_stopped = logprobs(tc.forward(DATA, "cross_entropy").result())
    stuck = _submit_out_of_order(server_process.url, key, tc.model_id)
    rest = tinker.RestClient(base_url=server_process.url, api_key=key)
    short_dir = _checkpoint_dir(server_process, short)
    assert os.path.isdir(short_dir)

    server_process.stop()
    time.sleep(1.1)  # let the short TTL pass while the server is down
    server_process.start()

    assert [r.training_run_id for r in rest.list_training_runs().result().training_runs] == [
        tc.model_id]
    listed = {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
    assert state in listed and short not in listed
    assert not os.path.exists(short_dir), "the expired checkpoint's files were deleted"

    with pytest.raises(tinker.BadRequestError, match="no live state"):
        tc.forward(DATA, "cross_entropy").result()
    lost = httpx.post(f"{server_process.url}/api/v1/retrieve_future", trust_env=False,
                      headers={"X-API-Key": key}, json={"request_id": stuck}).json()
    assert lost["category"] == "server" and "restarted" in lost["error"], lost

    resumed = client.create_training_client_from_state_with_optimizer(state).result()
    _step(resumed)
    for a, b in zip(logprobs(resumed.forward(DATA, "cross_entropy").result()), never_stopped,
                    strict=True):
        np.testing.assert_array_equal(a, b)
    client.close("success").result()


def _submit_out_of_order(url: str, key: str, model_id: str) -> str:
    """An optim_step far ahead of the client's counter: it waits in the queue forever."""
    body = {"model_id": model_id, "seq_id": 1_000, "type": "optim_step",
            "adam_params": types.AdamParams().model_dump()}
    answer = httpx.post(f"{url}/api/v1/optim_step", headers={"X-API-Key": key}, json=body,
                        trust_env=False)
    return str(answer.json()["request_id"])


def _checkpoint_dir(server: ServerProcess, path: str) -> str:
    run_id, kind, name = path.removeprefix("tinker://").split("/")
    parent = server.data_dir / "checkpoints" / run_id / kind
    [match] = [d for d in os.listdir(parent) if d.startswith(f"{name}.")]
    return str(parent / match)
