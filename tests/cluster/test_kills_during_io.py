"""Ray workers SIGKILLed in the middle of file work: during a ``save_state`` (the worker writes
the checkpoint) and while it pages adapters to disk (a budget that holds one adapter, so every
op pages one in and another out). Every acknowledged checkpoint stays listed and loads bitwise
as it was saved; every checkpoint listed loads; the runs go on from their latest save."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tinker
from ray.cluster_utils import Cluster

from tests.api.conftest import MODEL, Server
from tests.cluster.conftest import ray_server
from tests.cluster.test_paging_on_workers import worker_memory
from tests.cluster.test_worker_loss import logprobs, step, wait_for_workers, worker_of

Make = Callable[..., tinker.ServiceClient]


def _check_checkpoints(service: tinker.ServiceClient, model_id: str,
                       acked: dict[str, list[list[float]]]) -> None:
    """Every acknowledged checkpoint is listed and loads as saved; every listed one loads."""
    rest = service.create_rest_client()
    listed = {c.tinker_path for c in rest.list_checkpoints(model_id).result().checkpoints}
    assert set(acked) <= listed, f"acknowledged but not listed: {set(acked) - listed}"
    for path in sorted(listed):
        restored = service.create_training_client_from_state_with_optimizer(path).result()
        got = logprobs(restored)
        if path in acked:
            assert got == acked[path], f"{path} does not load as it was saved"


def _save(tc: tinker.TrainingClient, name: str, acked: dict[str, list[list[float]]]) -> None:
    try:
        state = logprobs(tc)
        acked[tc.save_state(name).result(timeout=120).path] = state
    except tinker.RequestFailedError as exc:  # the worker died under it: retryable, not acked
        assert exc.category == tinker.types.RequestErrorCategory.Server, exc


def test_a_worker_killed_during_a_save(service_client: Make, server: Server) -> None:
    service = service_client()
    tc = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    acked: dict[str, list[list[float]]] = {}
    for i in range(3):
        step(tc)
        _save(tc, f"before-{i}", acked)
    last_before = next(path for path in acked if path.endswith("before-2"))
    step(tc)
    state = logprobs(tc)
    victim = worker_of(server, tc.model_id)
    pending = tc.save_state("during-the-kill")
    os.kill(victim.pid, signal.SIGKILL)
    try:
        during: str | None = pending.result(timeout=120).path
    except tinker.RequestFailedError as exc:
        assert exc.category == tinker.types.RequestErrorCategory.Server, exc
        during = None
    if during is not None:
        acked[during] = state
    wait_for_workers(server, 2)
    _check_checkpoints(service, tc.model_id, acked)
    assert logprobs(tc) == acked[during or last_before], \
        "the run went on from its latest acknowledged save"


@pytest.fixture
def paged_server(ray_cluster: Cluster, tmp_path: Path, tiny_model_dir: Path
                 ) -> Iterator[Server]:
    """One worker whose adapter budget holds only the adapters an op pins, pages going to
    disk."""
    yield from ray_server(tmp_path / "data", tiny_model_dir, ray_cluster.address, workers=1,
                          adapter_memory_budget=1, host_memory_budget=0)


def test_a_worker_killed_while_it_pages_to_disk(service_client: Make,
                                                paged_server: Server) -> None:
    services = [tinker.ServiceClient(base_url=paged_server.url, api_key=f"tml-page-kill-{i}")
                for i in range(3)]
    runs = [s.create_lora_training_client(base_model=MODEL, rank=4, seed=i).result()
            for i, s in enumerate(services)]
    acked: list[dict[str, list[list[float]]]] = [{} for _ in runs]
    victim = worker_of(paged_server, runs[0].model_id)
    killer = threading.Timer(1.5, os.kill, (victim.pid, signal.SIGKILL))
    killer.start()
    began = time.monotonic()
    while time.monotonic() - began < 4.0:  # each op pages another tenant's adapter out
        for i, tc in enumerate(runs):
            try:
                step(tc)
            except tinker.RequestFailedError as exc:  # lost with the worker: retryable
                assert exc.category == tinker.types.RequestErrorCategory.Server, exc
                continue
            _save(tc, f"t{time.monotonic() - began:06.3f}", acked[i])
    killer.join()
    wait_for_workers(paged_server, 1)
    assert worker_of(paged_server, runs[0].model_id).pid != victim.pid
    for service, tc, saved in zip(services, runs, acked, strict=True):
        assert saved, "each run acknowledged a save"
        _check_checkpoints(service, tc.model_id, saved)
    memory = worker_memory(paged_server)
    assert memory["page_outs"] > 0 and memory["bytes_disk"] > 0, "the worker pages to disk"
