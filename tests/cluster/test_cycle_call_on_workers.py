"""A training cycle is one Ray call to its worker (`EngineWorker.run_cycle`): bitwise what the
two separate calls give, one datum's error fails only its work, a crashed batch call comes
back as a value (the other call's items still get theirs), and a worker killed during the call
fails the cycle with `WorkerLostError`."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster

from loraplex.cluster.ray_workers import RayWorkers
from loraplex.cluster.remote_executor import RemoteExecutor
from loraplex.cluster.worker import EngineWorker, WithMemory
from loraplex.config import ClusterConfig, EngineConfig, SchedulerConfig
from loraplex.domain.cycle import CallCrash, CycleOutcome
from loraplex.domain.lora import LoraConfig
from loraplex.domain.ops import CyclePlan
from loraplex.domain.results import AdapterMemory, ForwardBackwardResult, OptimStepResult
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.errors import UserError, WorkerLostError, user_error
from loraplex.scheduler.runner import run_plan
from tests.scheduler.work_builders import datum, fwd_bwd, optim

ADAPTERS = ("a:train:0", "b:train:0")


def works(bad: str | None = None, num_data: int = 1, length: int = 8
          ) -> tuple[list[ForwardBackwardWork], list[OptimStepWork]]:
    fwd = [fwd_bwd(a, 1, [datum([(7 * i + j) % 90 + 1 for j in range(length - 1)]
                                + [10**6 if a == bad else 5]) for i in range(num_data)]).op
           for a in ADAPTERS]
    return fwd, [optim(a, 2).op for a in ADAPTERS]  # type: ignore[return-value]


def bits(outcome: object) -> object:
    if isinstance(outcome, ForwardBackwardResult):
        return [x.tobytes() for x in outcome.logprobs], dict(outcome.metrics)
    return type(outcome).__name__


@pytest.fixture(scope="module")
def workers(ray_cluster: Cluster, tiny_model_dir: Path) -> Iterator[list[RemoteExecutor]]:
    pool = RayWorkers(ClusterConfig(workers=2, ray_address=ray_cluster.address),
                      EngineConfig(num_threads=1), SchedulerConfig())
    executors = [pool.spawn(str(tiny_model_dir)) for _ in range(2)]
    yield executors  # type: ignore[misc]
    for executor in executors:
        executor.close()


def fresh(worker: RemoteExecutor, tag: str) -> None:
    for adapter in ADAPTERS:
        worker.delete_adapter(adapter)
        worker.create_adapter(adapter, LoraConfig(rank=4, seed=hash((tag, adapter)) % 1000))


def test_one_cycle_call_gives_bitwise_what_the_two_calls_give(
        workers: list[RemoteExecutor]) -> None:
    two_calls, one_call = workers
    for worker in workers:
        fresh(worker, "bitwise")
    fwd, steps = works(num_data=2)
    for _ in range(2):
        expected = [bits(o) for o in two_calls.forward_backward(fwd)]
        expected_steps = two_calls.optim_step(steps)
        cycle = one_call.run_cycle(fwd, steps)
        assert not isinstance(cycle.forward_backward, CallCrash)
        assert [bits(o) for o in cycle.forward_backward] == expected
        assert cycle.optim_step == tuple(expected_steps)
    after = [bits(o) for o in two_calls.forward_backward(fwd)]
    assert [bits(o) for o in one_call.forward_backward(fwd)] == after, "stepped alike"


def test_a_bad_datum_in_a_cycle_call_fails_only_its_work(workers: list[RemoteExecutor]) -> None:
    worker = workers[0]
    fresh(worker, "bad")
    fwd, steps = works(bad="b:train:0")
    cycle = worker.run_cycle(fwd, steps)
    assert not isinstance(cycle.forward_backward, CallCrash)
    good, bad = cycle.forward_backward
    assert isinstance(good, ForwardBackwardResult) and isinstance(bad, UserError)
    assert not isinstance(cycle.optim_step, CallCrash)
    assert all(isinstance(o, OptimStepResult) for o in cycle.optim_step)


def test_a_worker_killed_during_a_cycle_call_loses_the_cycle(
        ray_cluster: Cluster, tiny_model_dir: Path) -> None:
    pool = RayWorkers(ClusterConfig(workers=1, ray_address=ray_cluster.address),
                      EngineConfig(num_threads=1), SchedulerConfig())
    victim = pool.spawn(str(tiny_model_dir))
    assert isinstance(victim, RemoteExecutor)
    fresh(victim, "kill")
    fwd, _ = works(num_data=64, length=120)
    items = [fwd_bwd(w.adapter_id, 1, list(w.data)) for w in fwd]
    plan = CyclePlan(tuple(items), tuple(optim(a, 2) for a in ADAPTERS))
    started = time.monotonic()
    threading.Timer(0.5, os.kill, (victim.pid, signal.SIGKILL)).start()
    outcome = run_plan(victim, plan)
    assert time.monotonic() - started > 0.5, "the cycle ended before the kill: make it longer"
    assert isinstance(outcome.lost, WorkerLostError) and "was lost" in str(outcome.lost)


# ---- the worker's side, without Ray ----------------------------------------------------------

class CrashingEngine:
    """forward_backward crashes (a bug) on adapter ``a``; optim_step steps."""

    def forward_backward(self, works: list[ForwardBackwardWork]) -> list[Any]:
        if any(w.adapter_id == "a:train:0" for w in works):
            raise KeyError("a bug in the engine")
        return [ForwardBackwardResult((), (), {"loss:sum": 0.0}) for _ in works]

    def optim_step(self, works: list[OptimStepWork]) -> list[Any]:
        if any(w.adapter_id == "c:train:0" for w in works):
            raise user_error("optimizer", "refused for the whole call")
        return [OptimStepResult({}) for _ in works]

    def adapter_memory(self) -> AdapterMemory:
        return AdapterMemory(resident_adapters=2, bytes_resident=100)


def worker_over(engine: object, is_rank: bool = False) -> EngineWorker:
    worker = EngineWorker.__new__(EngineWorker)
    worker._engine = engine  # type: ignore[assignment]
    worker._is_rank = is_rank
    return worker


def test_a_crash_in_a_workers_cycle_comes_back_as_a_value_with_its_traceback() -> None:
    fwd = [fwd_bwd("a:train:0", 1).op]
    steps = [optim("a:train:0", 2).op, optim("b:train:0", 2).op]
    answer = pickle.loads(pickle.dumps(worker_over(CrashingEngine()).run_cycle(fwd, steps)))
    assert isinstance(answer, WithMemory) and isinstance(answer.answer, CycleOutcome)
    cycle = answer.answer
    assert isinstance(cycle.forward_backward, CallCrash)
    assert "KeyError: 'a bug in the engine'" in str(cycle.forward_backward.error)
    assert "Traceback" in str(cycle.forward_backward.error)
    assert cycle.optim_step == (OptimStepResult({}),), "only b stepped"
    assert answer.memory == AdapterMemory(resident_adapters=2, bytes_resident=100)


def test_a_whole_call_domain_error_in_a_workers_cycle_comes_back_as_itself() -> None:
    steps = [optim("c:train:0", 2).op]
    cycle = worker_over(CrashingEngine()).run_cycle([], steps).answer
    assert isinstance(cycle.optim_step, CallCrash)
    assert isinstance(cycle.optim_step.error, UserError)


def test_a_rank_lets_a_crash_escape_so_its_group_is_lost() -> None:
    with pytest.raises(KeyError):
        worker_over(CrashingEngine(), is_rank=True).run_cycle([fwd_bwd("a:train:0", 1).op], [])
