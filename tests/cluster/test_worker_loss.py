"""Engine workers dying under a running server (two workers on the simulated cluster): a worker
killed with SIGKILL, then a node removed. Other tenants train on; the lost run's in-flight op
fails with a retryable error naming the checkpoint it was restored from; the run continues
bitwise from that save_state; a replacement worker joins; nothing acknowledged is lost. Also:
the same request gives the same bits on either worker."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest
import tinker
from ray.cluster_utils import Cluster
from tinker import types

from loraplex.cluster.remote_executor import RemoteExecutor
from tests.api.conftest import MODEL, Server
from tests.api.test_training import ADAM, datum

DATA = [datum([2, 3, 4, 5, 6]), datum([7, 8, 9])]
Make = Callable[..., tinker.ServiceClient]


def worker_of(server: Server, model_id: str) -> RemoteExecutor:
    lane = server.ctx.catalog.get(MODEL).lanes._owned(model_id)
    assert lane is not None
    executor = lane.scheduler.executor
    assert isinstance(executor, RemoteExecutor)
    return executor


def step(tc: tinker.TrainingClient) -> float:
    loss = tc.forward_backward(DATA, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(ADAM).result()
    return float(loss)


def logprobs(tc: tinker.TrainingClient) -> list[list[float]]:
    out = tc.forward(DATA, "cross_entropy").result()
    return [list(o["logprobs"].data) for o in out.loss_fn_outputs]


def wait_for_workers(server: Server, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(server.ctx.catalog.get(MODEL).lanes.schedulers()) < n:
        assert time.monotonic() < deadline, "no replacement worker joined"
        time.sleep(0.2)


def test_the_same_training_gives_the_same_bits_on_either_worker(service_client: Make,
                                                                 server: Server) -> None:
    a = service_client().create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    b = service_client().create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    assert worker_of(server, a.model_id).pid != worker_of(server, b.model_id).pid, "spread"
    assert [step(a) for _ in range(2)] == [step(b) for _ in range(2)]
    assert logprobs(a) == logprobs(b)


def _lose_worker_of(tc_lost: tinker.TrainingClient, tc_other: tinker.TrainingClient,
                    service: tinker.ServiceClient, server: Server,
                    kill: Callable[[RemoteExecutor], None]) -> None:
    """Train, save_state, step past it, lose the worker, check everything the issue asks."""
    step(tc_lost)
    saved = tc_lost.save_state("acked").result().path
    step(tc_lost)  # not in the checkpoint: lost with the worker, and the error says so
    reference = service.create_training_client_from_state_with_optimizer(saved).result()
    expected = logprobs(reference)
    step(tc_other)
    victim = worker_of(server, tc_lost.model_id)
    assert victim.pid != worker_of(server, tc_other.model_id).pid
    kill(victim)
    with pytest.raises(tinker.RequestFailedError, match=f"restored from {saved}") as info:
        tc_lost.forward_backward(DATA, "cross_entropy").result()
    assert info.value.category == types.RequestErrorCategory.Server
    step(tc_other)  # the other tenant trains on: no error
    assert logprobs(tc_lost) == expected, "the run continues bitwise from its save_state"
    step(tc_lost)
    listed = service.create_rest_client().list_checkpoints(tc_lost.model_id).result()
    assert saved in {c.tinker_path for c in listed.checkpoints}, "nothing acknowledged lost"
    wait_for_workers(server, 2)


def test_a_worker_killed_with_sigkill(service_client: Make, server: Server) -> None:
    service = service_client()
    lost = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    other = service_client().create_lora_training_client(base_model=MODEL, rank=4).result()
    _lose_worker_of(lost, other, service, server,
                    lambda victim: os.kill(victim.pid, signal.SIGKILL))


def test_a_node_removed_from_the_cluster(service_client: Make, server: Server,
                                         ray_cluster: Cluster) -> None:
    services = [service_client() for _ in range(2)]
    runs = [s.create_lora_training_client(base_model=MODEL, rank=4).result() for s in services]
    head = ray_cluster.head_node.node_id
    off_head = [i for i, tc in enumerate(runs) if worker_of(server, tc.model_id).node_id != head]
    assert off_head, "SPREAD put both workers on the head node"
    lost = off_head[0]
    node = next(n for n in ray_cluster.list_all_nodes()
                if n.node_id == worker_of(server, runs[lost].model_id).node_id)
    _lose_worker_of(runs[lost], runs[1 - lost], services[lost], server,
                    lambda victim: ray_cluster.remove_node(node))


def test_an_idle_worker_killed_is_noticed_and_replaced(service_client: Make,
                                                       server: Server) -> None:
    """SIGKILL a worker that has nothing to do: its lane's idle check notices within seconds
    (no op of its run needed), the run moves from its save_state, a replacement joins, and
    /stats keeps answering; the run's next step just works."""
    import httpx

    tc = service_client().create_lora_training_client(base_model=MODEL, rank=4).result()
    step(tc)
    tc.save_state("idle").result()
    expected = logprobs(tc)
    victim = worker_of(server, tc.model_id)
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while worker_of_or_none(server, tc.model_id) in (None, victim.pid):
        assert time.monotonic() < deadline, "the idle worker's loss went unnoticed"
        time.sleep(0.2)
    wait_for_workers(server, 2)
    stats = httpx.get(f"{server.url}/api/v1/loraplex/stats", trust_env=False, timeout=30,
                      headers={"X-API-Key": "tml-idle-check"})
    assert stats.status_code == 200
    assert victim.pid not in {worker_of(server, tc.model_id).pid}
    assert logprobs(tc) == expected, "moved bitwise from its save_state, no op lost"


def worker_of_or_none(server: Server, model_id: str) -> int | None:
    lane = server.ctx.catalog.get(MODEL).lanes._owned(model_id)
    executor = None if lane is None else lane.scheduler.executor
    return executor.pid if isinstance(executor, RemoteExecutor) else None
