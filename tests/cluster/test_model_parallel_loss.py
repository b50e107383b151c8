"""A rank of a model-parallel group killed with SIGKILL under a running server (two groups
of two local rank processes, no Ray): the group is lost as a whole, like a lost worker. The
lost run's in-flight op fails with a retryable error naming the checkpoint it was restored
from; the run continues bitwise from that save_state on the surviving group; the other
group's tenant trains on; a replacement group starts."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tinker
from tinker import types

from loraplex.cluster.local_groups import LocalGroups
from loraplex.cluster.model_parallel import ModelParallelGroup
from loraplex.config import EngineConfig
from tests.api.conftest import MODEL, Server
from tests.cluster.test_model_parallel_local import group_server
from tests.cluster.test_worker_loss import DATA, logprobs, step

Make = Callable[..., tinker.ServiceClient]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Server]:
    groups = LocalGroups(EngineConfig(num_threads=1), model_parallel=2, workers=2)
    yield from group_server(tmp_path_factory.mktemp("mp-loss"), tiny_model_dir, groups)


def group_of(server: Server, model_id: str) -> ModelParallelGroup:
    lane = server.ctx.catalog.get(MODEL).lanes._owned(model_id)
    assert lane is not None
    group = lane.scheduler.executor
    assert isinstance(group, ModelParallelGroup)
    return group


def test_a_rank_killed_loses_its_group_and_its_runs_move(service_client: Make,
                                                         server: Server) -> None:
    service = service_client()
    lost = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    other = service_client().create_lora_training_client(base_model=MODEL, rank=4).result()
    victim = group_of(server, lost.model_id)
    assert victim is not group_of(server, other.model_id), "runs spread over the groups"
    step(lost)
    saved = lost.save_state("acked").result().path
    step(lost)  # not in the checkpoint: lost with the group, and the error says so
    expected = logprobs(service.create_training_client_from_state_with_optimizer(saved)
                        .result())
    step(other)
    pid = victim.ranks[0].pid  # type: ignore[attr-defined]
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(tinker.RequestFailedError, match=f"restored from {saved}") as info:
        lost.forward_backward(DATA, "cross_entropy").result()
    assert info.value.category == types.RequestErrorCategory.Server
    step(other)  # the other group's tenant trains on
    assert logprobs(lost) == expected, "the run continues bitwise from its save_state"
    assert group_of(server, lost.model_id) is not victim
    recovery_s = time.monotonic() - started
    deadline = time.monotonic() + 60
    while len(server.ctx.catalog.get(MODEL).lanes.schedulers()) < 2:
        assert time.monotonic() < deadline, "no replacement group joined"
        time.sleep(0.2)
    assert recovery_s < 60

