"""``loraplex serve --model-parallel 2`` without Ray: one engine worker made of two local rank
processes (gloo, one thread each), each holding half of the model as a pipeline stage. The
SDK's SFT, GRPO (every loss) and save/resume tests of tests/api run against it unchanged:
``kl_sample_train`` exactly 0, checkpoints that load back bit for bit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loraplex.cluster.local_groups import LocalGroups
from loraplex.cluster.model_parallel import ModelParallelGroup
from loraplex.config import (
    DEFAULT_MODEL_NAME,
    EngineConfig,
    ModelSource,
    SchedulerConfig,
    ServerConfig,
)
from tests.api.conftest import MODEL, Server, new_key, service_client  # noqa: F401
from tests.api.live_server import live_server
from tests.api.test_grpo import (  # noqa: F401  (collected here, run against the group)
    test_grpo_steps_train_on_policy_with_zero_sampler_trainer_kl,
)
from tests.api.test_training import (  # noqa: F401
    test_save_state_then_load_with_and_without_optimizer,
    test_sft_loop_with_pipelined_chunked_steps_lowers_the_loss,
)
from tests.integration.serve_fake import seed_builtin_tiny


def group_server(data_dir: Path, tiny_model_dir: Path, groups: LocalGroups) -> Iterator[Server]:
    from loraplex.cli.serve_cmd import build_context

    seed_builtin_tiny(data_dir, tiny_model_dir)
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=str(data_dir), open_access=True,
                          models=(ModelSource(DEFAULT_MODEL_NAME, "builtin:tiny"),),
                          client_config={"fwdbwd_max_chunk_len": 2})
    ctx = build_context(config, SchedulerConfig(), groups.group)
    with live_server(ctx) as url:
        yield Server(url, ctx)
    ctx.stores.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Server]:
    groups = LocalGroups(EngineConfig(num_threads=1), model_parallel=2)
    yield from group_server(tmp_path_factory.mktemp("mp-data"), tiny_model_dir, groups)


def test_the_worker_is_a_group_of_two_stages_that_split_the_weights(
        server: Server, tiny_model_dir: Path) -> None:
    from loraplex.engine.model.loader import load_model

    [(_, scheduler)] = server.ctx.catalog.get(MODEL).lanes.schedulers()
    group = scheduler.executor
    assert isinstance(group, ModelParallelGroup) and len(group.ranks) == 2
    whole = load_model(tiny_model_dir, EngineConfig(num_threads=1))
    # Every tensor on one rank only (the tied embedding and head on the last stage, once);
    # two layers cannot be split more evenly than one each.
    assert sum(group.weight_bytes) == whole.weights.nbytes() + whole.packed_bytes()
    assert all(0 < b < sum(group.weight_bytes) for b in group.weight_bytes)


def test_when_the_only_group_is_lost_its_runs_wait_for_the_replacement(
        service_client, server: Server) -> None:  # noqa: F811  (runs last: it kills the group)
    import os
    import signal

    import tinker

    from tests.cluster.test_worker_loss import DATA, logprobs, step

    service = service_client()
    tc = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    step(tc)
    saved = tc.save_state("only").result().path
    expected = logprobs(tc)
    [(_, scheduler)] = server.ctx.catalog.get(MODEL).lanes.schedulers()
    group = scheduler.executor
    assert isinstance(group, ModelParallelGroup)
    os.kill(group.ranks[1].pid, signal.SIGKILL)  # type: ignore[attr-defined]
    with pytest.raises(tinker.RequestFailedError, match=f"restored from {saved}"):
        tc.forward_backward(DATA, "cross_entropy").result()
    assert logprobs(tc) == expected  # on the replacement group, restored from the save
    [(_, replacement)] = server.ctx.catalog.get(MODEL).lanes.schedulers()
    assert replacement.executor is not group
