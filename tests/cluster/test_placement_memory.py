"""Placing a new training run does not ask every worker for its adapter memory on each
create: a `RemoteExecutor` keeps what its worker answered (beside each cycle and sample step,
or when asked once) until a call that may change it, so placement decisions stay the same
given the same memory (`cluster.memory_cache`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loraplex.cluster.memory_cache import MemoryCache
from loraplex.cluster.remote_executor import RemoteExecutor
from loraplex.cluster.worker import WithMemory
from loraplex.domain.cycle import CycleOutcome
from loraplex.domain.lora import LoraConfig
from loraplex.domain.results import AdapterMemory, SampleStep
from loraplex.errors import WorkerLostError
from loraplex.scheduler.lanes import Lanes
from loraplex.store.stores import Stores, open_stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import make_scheduler

INFO = ToyExecutor().model_info()


class FakeHead:
    """A Ray head that is always up and answers refs at once (they are the values)."""

    lost: str | None = None

    def check(self, generation: int) -> None:
        if self.lost is not None:
            raise WorkerLostError(self.lost)

    def get(self, ref: Any, generation: int) -> Any:
        if isinstance(ref, BaseException):
            raise ref
        return ref

    def is_current(self, generation: int) -> bool:
        return True


class FakeActor:
    """An `EngineWorker` actor handle counting calls; its memory grows per adapter created."""

    def __init__(self, budget: int | None, per_adapter: int = 10) -> None:
        self.calls: Counter[str] = Counter()
        self.adapters: set[str] = set()
        self.budget, self.per_adapter = budget, per_adapter
        self.dead = False

    def memory(self) -> AdapterMemory:
        return AdapterMemory(resident_adapters=len(self.adapters),
                             bytes_resident=self.per_adapter * len(self.adapters),
                             budget_bytes=self.budget)

    def __getattr__(self, method: str) -> Any:
        actor = self

        class Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                actor.calls[method] += 1
                if actor.dead:
                    return WorkerLostError("engine worker fake was lost (RayActorError)")
                return actor.answer(method, args)

        return Method

    def answer(self, method: str, args: tuple[Any, ...]) -> Any:
        match method:
            case "create_adapter":
                self.adapters.add(args[0])
            case "delete_adapter":
                self.adapters.discard(args[0])
            case "adapter_memory":
                return self.memory()
            case "run_cycle":
                return WithMemory(CycleOutcome((), ()), self.memory())
            case "sample_step":
                return WithMemory(SampleStep(), self.memory())
        return None


def remote(actor: FakeActor, head: FakeHead | None = None) -> RemoteExecutor:
    return RemoteExecutor("fake", actor, INFO, 1, "node", head or FakeHead(), 1)  # type: ignore[arg-type]


def test_memory_is_asked_once_then_kept_until_a_call_changes_it() -> None:
    actor = FakeActor(budget=100)
    worker = remote(actor)
    assert worker.adapter_memory().bytes_resident == 0
    assert worker.adapter_memory().bytes_resident == 0
    assert actor.calls["adapter_memory"] == 1
    worker.create_adapter("m", LoraConfig(rank=4))
    assert worker.adapter_memory().bytes_resident == 10, "asked again after the create"
    assert actor.calls["adapter_memory"] == 2


def test_a_cycles_answer_brings_the_memory_along() -> None:
    actor = FakeActor(budget=100)
    worker = remote(actor)
    worker.create_adapter("m", LoraConfig(rank=4))
    worker.run_cycle([], [])
    assert worker.adapter_memory().bytes_resident == 10
    worker.sample_step([], 4)
    assert worker.adapter_memory().bytes_resident == 10
    assert actor.calls["adapter_memory"] == 0


def test_a_lost_worker_or_head_is_not_hidden_by_the_kept_memory() -> None:
    actor, head = FakeActor(budget=100), FakeHead()
    worker = remote(actor, head)
    worker.adapter_memory()
    head.lost = "the Ray head is unreachable"
    with pytest.raises(WorkerLostError):
        worker.adapter_memory()
    head.lost = None
    actor.dead = True
    with pytest.raises(WorkerLostError):
        worker.run_cycle([], [])
    with pytest.raises(WorkerLostError):
        worker.adapter_memory()


def test_a_reading_that_raced_a_change_is_not_kept() -> None:
    cache = MemoryCache()
    stale = AdapterMemory(resident_adapters=0, bytes_resident=0)

    def ask() -> AdapterMemory:
        cache.changing()  # a create starts while the reading is in flight
        return stale

    assert cache.get(ask) == stale
    fresh = AdapterMemory(resident_adapters=1, bytes_resident=10)
    assert cache.get(lambda: fresh) == fresh


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = open_stores(str(tmp_path / "data"))
    yield s
    s.close()


def test_placing_many_runs_asks_each_worker_once_and_places_as_before(stores: Stores) -> None:
    actors = [FakeActor(budget=100, per_adapter=30), FakeActor(budget=100, per_adapter=10)]
    lanes = Lanes(lambda executor: make_scheduler(executor, stores), stores.checkpoints)
    for actor in actors:
        lanes.add_worker(remote(actor))
    actors[0].adapters.add("already-there")  # worker 0 has less free memory
    placed = [lanes.place().name for _ in range(10)]
    assert placed == ["w1"] * 10, "the most free adapter memory, as the policy says"
    assert [a.calls["adapter_memory"] for a in actors] == [1, 1]
