"""A simulated 3-node Ray cluster (`ray.cluster_utils.Cluster`, one CPU per node) shared by the
cluster tests, and servers whose engines are Ray actors on it (CPU actors, one torch thread
each). The SDK fixtures of tests/api are reused, so its tests run unchanged against workers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from loraplex.cluster.ray_workers import RayWorkers  # noqa: E402
from loraplex.config import (  # noqa: E402
    DEFAULT_MODEL_NAME,
    ClusterConfig,
    EngineConfig,
    ModelSource,
    SchedulerConfig,
    ServerConfig,
)
from tests.api.conftest import Server, new_key, service_client  # noqa: E402,F401
from tests.api.live_server import live_server  # noqa: E402
from tests.integration.serve_fake import seed_builtin_tiny  # noqa: E402

NODES = 3


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Cluster]:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(NODES - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def ray_server(data_dir: Path, tiny_model_dir: Path, address: str, workers: int = 2,
               model_parallel: int = 1, worker_resources: str = "CPU=1", **engine: Any
               ) -> Iterator[Server]:
    """A real server whose ``workers`` engines are Ray actors of the cluster at ``address``
    (each a group of ``model_parallel`` rank actors)."""
    from loraplex.cli.serve_cmd import build_context

    seed_builtin_tiny(data_dir, tiny_model_dir)
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=str(data_dir), open_access=True,
                          models=(ModelSource(DEFAULT_MODEL_NAME, "builtin:tiny"),),
                          client_config={"fwdbwd_max_chunk_len": 2})
    scheduler = SchedulerConfig()
    pool = RayWorkers(ClusterConfig(workers=workers, ray_address=address,
                                    model_parallel=model_parallel,
                                    worker_resources=worker_resources),
                      EngineConfig(num_threads=1, **engine), scheduler)
    ctx = build_context(config, scheduler, pool.group)
    with live_server(ctx) as url:
        yield Server(url, ctx)
    ctx.stores.close()


@pytest.fixture(scope="module")
def server(ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
           tiny_model_dir: Path) -> Iterator[Server]:
    """The module's server: two engine workers on the cluster."""
    yield from ray_server(tmp_path_factory.mktemp("ray-data"), tiny_model_dir,
                          ray_cluster.address)
