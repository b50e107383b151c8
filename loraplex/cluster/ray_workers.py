"""`RayWorkers`: starts (``--workers N``) or joins (``--ray-address``) a Ray runtime and
places engine workers as actors, N per model source.

Placement: each worker is one actor asking for one bundle of ``--worker-resources`` (e.g.
``CPU=1`` or ``GPU=1``), with Ray's ``SPREAD`` strategy, so a model's workers go to different
nodes when the cluster has several (a node's loss then takes as few workers as possible) and
share a node's devices otherwise. A replacement for a lost worker is the same request: Ray
starts it when a bundle's resources are free again. Every host must see the model source and
the data dir at the same paths (the workers read models and write checkpoints there).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import ray

from loraplex.cluster.local_groups import group_store, start_group
from loraplex.cluster.model_parallel import ModelParallelGroup, RankHandle
from loraplex.cluster.ray_head import RayHead
from loraplex.cluster.remote_executor import RemoteExecutor, call_actor
from loraplex.cluster.worker import EngineWorker, GroupMember
from loraplex.config import ClusterConfig, EngineConfig, SchedulerConfig
from loraplex.engine.host_allocator import SINGLE_ARENA_ENV
from loraplex.errors import user_error
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.lanes import WorkerGroup

log = logging.getLogger("loraplex.cluster")


@dataclass(frozen=True)
class Bundle:
    """One worker's Ray resources."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    custom: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def parse(spec: str, field: str = "cluster.worker_resources") -> Bundle:
        """``CPU=1`` / ``GPU=1,CPU=4`` / ``CPU=1,accelerator_h200=1``."""
        cpus, gpus, custom = 0.0, 0.0, []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, value = part.partition("=")
            try:
                amount = float(value)
            except ValueError:
                amount = -1.0
            if not sep or not name or amount < 0:
                raise user_error(field, f"expected NAME=AMOUNT[,NAME=AMOUNT...], got {spec!r}")
            if name.upper() == "CPU":
                cpus = amount
            elif name.upper() == "GPU":
                gpus = amount
            else:
                custom.append((name, amount))
        return Bundle(cpus or (0.0 if gpus else 1.0), gpus, tuple(custom))


class RayWorkers:
    """The Ray side of a server: its runtime and the engine actors it placed.

    Args:
        cluster: workers per model, Ray address, one worker's resources.
        engine: the engine slice each worker builds its Engine with.
        scheduler: for the IO threads a worker must serve beside its compute calls.
    """

    def __init__(self, cluster: ClusterConfig, engine: EngineConfig,
                 scheduler: SchedulerConfig) -> None:
        self.cluster = cluster
        self.engine = engine
        self.bundle = Bundle.parse(cluster.worker_resources)
        self._concurrency = 1 + scheduler.io_threads
        self.head = RayHead(cluster.ray_address, cluster.ray_host or "127.0.0.1",
                            cluster.head_probe_interval_s)
        self.head.connect()
        self.head.start()
        log.info("ray: worker bundle %s", self.bundle)

    def group(self, model_dir: str) -> WorkerGroup:
        """``cluster.workers`` workers of ``model_dir`` (started concurrently), and how to
        start another."""
        with ThreadPoolExecutor(max(1, self.cluster.workers)) as pool:
            executors = list(pool.map(lambda _: self.spawn(model_dir),
                                      range(self.cluster.workers)))
        return WorkerGroup(list(executors), spawn=lambda: self.spawn(model_dir),
                           health=lambda: self.head.problem)

    def spawn(self, model_dir: str) -> BatchExecutor:
        """One more worker of ``model_dir`` (a group of ``model_parallel`` ranks); blocks
        until it has loaded the model (and, while the Ray head is lost, until it is back)."""
        generation = self.head.wait_up()
        if self.cluster.model_parallel > 1:
            return self.spawn_group(model_dir, generation)
        actor = self._actor(model_dir, "SPREAD")
        info, pid, node_id, _ = self.head.get(actor.ready.remote(), generation)
        name = f"pid {pid}"
        log.info("engine worker %s up on node %s (%s)", name, node_id[:8], model_dir)
        return RemoteExecutor(name, actor, info, pid, node_id, self.head, generation)

    def spawn_group(self, model_dir: str, generation: int) -> ModelParallelGroup:
        """``model_parallel`` rank actors, one per bundle of a ``STRICT_PACK`` placement
        group (the group's ranks share a node and its fast links); they rendezvous at a
        store this process holds. ``generation``: the Ray runtime they are made in."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        world = self.cluster.model_parallel
        bundle = {"CPU": self.bundle.num_cpus, "GPU": self.bundle.num_gpus,
                  **dict(self.bundle.custom)}
        pg = placement_group([{k: v for k, v in bundle.items() if v}] * world,
                             strategy="STRICT_PACK")
        self.head.get(pg.ready(), generation)
        store = group_store(ray.util.get_node_ip_address(), world)
        device = "cuda:0" if self.bundle.num_gpus else "cpu"  # Ray shows each actor its GPU
        ranks: list[RankHandle] = []
        for rank in range(world):
            member = GroupMember(rank, world, ray.util.get_node_ip_address(), store.port,
                                 device)
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=rank)
            ranks.append(RayRank(f"rank {rank}", self._actor(model_dir, strategy, member),
                                 self.head, generation, self._concurrency))

        def release() -> None:  # a lost runtime's placement group went with it
            if self.head.is_current(generation):
                remove_placement_group(pg)

        return start_group(ranks, model_dir, store, release)

    def _actor(self, model_dir: str, strategy: Any, member: GroupMember | None = None) -> Any:
        """An `EngineWorker` actor of one bundle (created; its constructor runs in Ray)."""
        options: dict[str, Any] = dict(
            num_cpus=self.bundle.num_cpus, num_gpus=self.bundle.num_gpus,
            resources=dict(self.bundle.custom), max_concurrency=self._concurrency,
            max_restarts=0, scheduling_strategy=strategy)
        if self.engine.retain_host_memory:  # Ray's threads run before the engine's constructor
            options["runtime_env"] = {"env_vars": dict(SINGLE_ARENA_ENV)}
        remote: Any = ray.remote(EngineWorker)  # Ray's actor class (untyped)
        return remote.options(**options).remote(model_dir, self.engine,
                                                int(self.bundle.num_cpus) or 1, member)

    def shutdown(self) -> None:
        self.head.shutdown()


class RayRank:
    """A rank actor as a `RankHandle`: each call a Ray task, awaited through the head
    (`RayHead.get`) by a thread of the rank's own, so it fails with `WorkerLostError` when the
    actor dies or the Ray head is lost (a bare Ray future would wait forever for a lost head),
    and an actor of an earlier runtime is never called (the group is lost, and replaced).

    Args:
        name: for errors (``rank 0``).
        actor: the `EngineWorker` actor.
        head: the connection, and ``generation``: the runtime the actor was made in.
        concurrency: calls in flight at once (the actor's ``max_concurrency``).
    """

    def __init__(self, name: str, actor: Any, head: RayHead, generation: int,
                 concurrency: int) -> None:
        self.name = name
        self.actor = actor
        self._head, self._generation = head, generation
        self._waiters = ThreadPoolExecutor(concurrency, thread_name_prefix=f"loraplex-{name}")

    def submit(self, method: str, *args: Any) -> Future[Any]:
        return self._waiters.submit(call_actor, self._head, self._generation, self.actor,
                                    self.name, method, args)

    def kill(self) -> None:
        """End the actor; nothing to do when its runtime is gone."""
        if self._head.is_current(self._generation):
            ray.kill(self.actor, no_restart=True)
