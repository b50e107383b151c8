"""`LocalGroups`: ``--model-parallel N`` without Ray: each engine worker is a group of N child
processes of the server (`LocalWorker`), one per pipeline stage, rendezvousing at a TCP store
the server holds on the loopback interface.

Each rank gets ``engine.num_threads`` torch threads (one by default: N ranks on N cores), and
its own device: the CPU, or CUDA device ``k`` for the k-th rank started (ranks of one group
on consecutive devices). A replacement group is started the same way. `group_saver` writes a
group's checkpoints from its ranks' shares (also used by the Ray launcher).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from concurrent.futures import wait
from datetime import timedelta
from typing import Any

from loraplex.cluster.local_worker import LocalWorker
from loraplex.cluster.model_parallel import ModelParallelGroup, RankHandle
from loraplex.cluster.worker import GroupMember
from loraplex.config import EngineConfig
from loraplex.domain.work import SaveWork
from loraplex.scheduler.lanes import WorkerGroup

log = logging.getLogger("loraplex.cluster")
LOOPBACK = "127.0.0.1"


def group_saver(model_dir: str) -> Callable[[SaveWork, list[Any]], int]:
    """Writes a save's joined shares as one checkpoint of the whole model."""
    from loraplex.engine.group_checkpoint import save_joined
    from loraplex.engine.model.spec import ModelSpec

    spec = ModelSpec.from_dir(model_dir)

    def save(work: SaveWork, shares: list[Any]) -> int:
        return save_joined(work.directory, shares, spec, model_dir, work.peft_export)

    return save


def group_store(host: str, world: int) -> Any:
    """A TCP store for one group's rendezvous, on a free port (the server holds it)."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=600))


def start_group(ranks: list[RankHandle], model_dir: str, store: Any,
                on_close: Callable[[], None] | None = None) -> ModelParallelGroup:
    """Wait for every rank's ``ready`` (they join the process group and load their stages
    meanwhile) and wrap them as one executor."""
    futures = [rank.submit("ready") for rank in ranks]
    wait(futures)
    try:
        answers = [f.result() for f in futures]
    except Exception:
        for rank in ranks:
            rank.kill()
        raise
    info = answers[-1][0]
    name = "+".join(f"pid {a[1]}" for a in answers)

    def close() -> None:
        del store_ref[:]
        if on_close is not None:
            on_close()

    store_ref = [store]  # the store lives as long as the group
    group = ModelParallelGroup(name, ranks, info, [a[3] for a in answers],
                               group_saver(model_dir), close)
    log.info("engine group %s up (%d stages; base weights per rank: %s bytes)", name,
             len(ranks), [a[3] for a in answers])
    return group


class LocalGroups:
    """Model-parallel groups of local processes (see the module docstring).

    Args:
        engine: the engine slice every rank builds its stage with.
        model_parallel: ranks per group.
        workers: groups per model (at least one).
    """

    def __init__(self, engine: EngineConfig, model_parallel: int, workers: int = 1) -> None:
        self.engine = engine
        self.model_parallel = model_parallel
        self.workers = max(1, workers)
        self._next_rank = itertools.count()

    def group(self, model_dir: str) -> WorkerGroup:
        """``workers`` groups of ``model_dir``, and how to start another."""
        groups: list[Any] = [self.spawn(model_dir) for _ in range(self.workers)]
        return WorkerGroup(groups, spawn=lambda: self.spawn(model_dir))

    def spawn(self, model_dir: str) -> ModelParallelGroup:
        """One more group of ``model_dir``; blocks until every rank has loaded its stage."""
        world = self.model_parallel
        store = group_store(LOOPBACK, world)
        ranks: list[RankHandle] = []
        for rank in range(world):
            index = next(self._next_rank)
            member = GroupMember(rank, world, LOOPBACK, store.port, self._device(index))
            ranks.append(LocalWorker(f"rank{index}", model_dir, self.engine,
                                     self.engine.num_threads or 1, member))
        return start_group(ranks, model_dir, store)

    def _device(self, index: int) -> str:
        from loraplex.engine.model.loader import resolve_device

        device = resolve_device(self.engine.device)
        if device.type != "cuda":
            return "cpu"
        import torch

        return f"cuda:{index % torch.cuda.device_count()}"
