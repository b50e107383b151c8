"""``loraplex serve --workers 1 --model-parallel 2`` on the simulated Ray cluster: one engine
worker made of two rank actors in a ``STRICT_PACK`` placement group (half a CPU each, so both
fit one node), gloo between them. The SDK's SFT, GRPO (every loss) and save/resume tests of
tests/api run against it unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from loraplex.cluster.model_parallel import ModelParallelGroup
from tests.api.conftest import MODEL, Server, new_key, service_client  # noqa: F401
from tests.api.test_grpo import (  # noqa: F401  (collected here, run against the group)
    test_grpo_steps_train_on_policy_with_zero_sampler_trainer_kl,
)
from tests.api.test_training import (  # noqa: F401
    test_save_state_then_load_with_and_without_optimizer,
    test_sft_loop_with_pipelined_chunked_steps_lowers_the_loss,
)
from tests.cluster.conftest import ray_server


@pytest.fixture(scope="module")
def server(ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
           tiny_model_dir: Path) -> Iterator[Server]:
    yield from ray_server(tmp_path_factory.mktemp("ray-mp-data"), tiny_model_dir,
                          ray_cluster.address, workers=1, model_parallel=2,
                          worker_resources="CPU=0.5")


def test_the_ranks_are_two_actors_packed_on_one_node(server: Server) -> None:
    import ray

    [(_, scheduler)] = server.ctx.catalog.get(MODEL).lanes.schedulers()
    group = scheduler.executor
    assert isinstance(group, ModelParallelGroup) and len(group.ranks) == 2
    nodes = {ray.get(rank.actor.ready.remote())[2] for rank in group.ranks}  # type: ignore[attr-defined]
    assert len(nodes) == 1, "STRICT_PACK keeps a group on one node"
