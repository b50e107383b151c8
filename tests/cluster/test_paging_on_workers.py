"""Adapter paging on a Ray worker: four tenants trained in turn on one worker whose budget
holds about one training adapter give bitwise the results of a worker without a budget (and
of the in-process engine), and the stats endpoint shows the pages moving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tinker
from ray.cluster_utils import Cluster

from tests.api.conftest import MODEL, Server
from tests.api.live_server import live_server
from tests.api.test_training import ADAM, datum
from tests.cluster.conftest import ray_server
from tests.integration.serve_fake import fake_context, seed_builtin_tiny

DATA = [datum([2, 3, 4, 5, 6, 7]), datum([8, 9, 10])]
TENANTS = 4


@pytest.fixture(scope="module")
def reference(ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
              tiny_model_dir: Path) -> Iterator[Server]:
    yield from ray_server(tmp_path_factory.mktemp("unpaged"), tiny_model_dir,
                          ray_cluster.address, workers=1)


def train_in_turn(url: str, keys: list[str], rounds: int = 3) -> list[list[float]]:
    clients = [tinker.ServiceClient(base_url=url, api_key=k) for k in keys]
    try:
        runs = [c.create_lora_training_client(base_model=MODEL, rank=4, seed=i).result()
                for i, c in enumerate(clients)]
        losses: list[list[float]] = [[] for _ in runs]
        for _ in range(rounds):
            for i, tc in enumerate(runs):  # each step evicts another tenant's adapter
                fb = tc.forward_backward(DATA, "cross_entropy")
                tc.optim_step(ADAM).result()
                losses[i].append(fb.result().metrics["loss:sum"])
        for i, tc in enumerate(runs):
            out = tc.forward(DATA, "cross_entropy").result()
            losses[i] += [x for o in out.loss_fn_outputs for x in o["logprobs"].data]
        return losses
    finally:
        for client in clients:
            client.holder.close()


def worker_memory(server: Server) -> dict[str, int]:
    key = server.ctx.stores.keys.create("paging-ops", operator=True)
    stats = httpx.get(f"{server.url}/api/v1/loraplex/stats", headers={"X-API-Key": key},
                      trust_env=False, timeout=30).json()
    (worker,) = stats["workers"]
    return dict(worker["memory"])


def test_four_tenants_on_a_worker_that_holds_one_train_bitwise_as_without_paging(
        reference: Server, ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
        tiny_model_dir: Path) -> None:
    keys = [f"tml-paging-{i}" for i in range(TENANTS)]
    expected = train_in_turn(reference.url, keys)
    in_process = tmp_path_factory.mktemp("in-process")
    seed_builtin_tiny(in_process, tiny_model_dir)
    ctx = fake_context(str(in_process), executor="engine", num_threads=1,
                       client_config={"fwdbwd_max_chunk_len": 2})
    with live_server(ctx) as url:
        assert train_in_turn(url, keys) == expected, "one Ray worker = the in-process engine"
    ctx.stores.close()
    unpaged = worker_memory(reference)
    per_adapter = unpaged["bytes_resident"] // TENANTS
    assert unpaged["page_outs"] == 0 and per_adapter > 0
    budget = per_adapter + per_adapter // 2  # one training adapter's state, not two
    paged = ray_server(tmp_path_factory.mktemp("paged"), tiny_model_dir, ray_cluster.address,
                       workers=1, adapter_memory_budget=budget, host_memory_budget=0)
    server = next(paged)
    try:
        assert train_in_turn(server.url, keys) == expected
        memory = worker_memory(server)
        assert memory["budget_bytes"] == budget and memory["bytes_resident"] <= budget
        assert memory["page_outs"] >= TENANTS and memory["paged_adapters"] >= TENANTS - 1
        assert memory["bytes_disk"] > 0, "host budget 0: paged state went to disk"
    finally:
        next(paged, None)
