"""Builders of work items and a synchronous driver for scheduler tests (no threads)."""

from __future__ import annotations

import itertools
from array import array

from loraplex.config import SchedulerConfig
from loraplex.domain.data import Datum, TensorData
from loraplex.domain.lora import LoraConfig
from loraplex.domain.ops import CreateModelOp, SampleOp, WorkItem
from loraplex.domain.optim import AdamParams
from loraplex.domain.sampling import SamplingParams
from loraplex.domain.training_run import TrainingRun
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork, SampleWork
from loraplex.scheduler.assembly import build_scheduler
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.io_workers import InlineIo
from loraplex.scheduler.runner import run_plan
from loraplex.scheduler.scheduler import Scheduler
from loraplex.store.stores import Stores

_ids = itertools.count()


def rid() -> str:
    return f"req-{next(_ids)}"


def make_scheduler(executor, stores: Stores, clock=None, **config) -> Scheduler:  # type: ignore[no-untyped-def]
    config.setdefault("sample_anticipation_s", 0.0)  # no real-time holds unless a test asks
    futures = FutureStore(ttl_s=3600, journal=stores.futures)
    effects = Effects(stores.runs, stores.checkpoints, stores.samplers, stores.sequences)
    if clock is None:
        return build_scheduler(executor, SchedulerConfig(**config), futures, effects,
                               io=InlineIo())
    return build_scheduler(executor, SchedulerConfig(**config), futures, effects, clock=clock,
                           io=InlineIo())


class FakeClock:
    """A monotonic clock tests move by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def drain(scheduler: Scheduler, max_steps: int = 1000) -> int:
    """Run plans until nothing is left; returns the number of engine calls."""
    for n in range(max_steps):
        plan = scheduler.plan()
        if plan is None:
            return n
        scheduler.complete(plan, run_plan(scheduler.executor, plan))
    raise AssertionError("scheduler did not go idle")


def datum(tokens: list[int], weight: float = 1.0) -> Datum:
    n = len(tokens)
    targets = [*tokens[1:], tokens[0]]
    return Datum(array("q", tokens), {
        "target_tokens": TensorData.from_list(targets, "int64"),
        "weights": TensorData.from_list([weight] * n, "float32"),
    })


def create(model_id: str, tenant: str = "alice", rank: int = 4) -> WorkItem:
    run = TrainingRun(model_id, tenant, model_id.split(":")[0], "toy", LoraConfig(rank),
                      {"type": "adamw"}, {})
    return WorkItem(rid(), tenant, "CreateModel", CreateModelOp(run), model_id=model_id, seq_id=0)


def fwd_bwd(model_id: str, seq: int, data: list[Datum] | None = None, tenant: str = "alice",
            loss_fn: str = "cross_entropy", forward_only: bool = False) -> WorkItem:
    request_id = rid()
    work = ForwardBackwardWork(request_id, model_id, tuple(data or [datum([2, 3, 4, 5])]),
                               loss_fn, {}, forward_only)
    return WorkItem(request_id, tenant, "Forward" if forward_only else "ForwardBackward",
                    work, model_id=model_id, seq_id=seq)


def optim(model_id: str, seq: int, tenant: str = "alice", lr: float = 0.1) -> WorkItem:
    request_id = rid()
    return WorkItem(request_id, tenant, "OptimStep",
                    OptimStepWork(request_id, model_id, AdamParams(learning_rate=lr)),
                    model_id=model_id, seq_id=seq)


def sample(prompt: list[int], tenant: str = "alice", adapter_id: str | None = None,
           max_tokens: int = 6, num_samples: int = 1, key: tuple[str, int] | None = None,
           source: str = "base", model_id: str | None = None, stream: bool = False
           ) -> WorkItem:
    request_id = rid()
    work = SampleWork(request_id, adapter_id, None, array("q", prompt), num_samples,
                      SamplingParams(max_tokens=max_tokens, seed=7), stream=stream)
    ids = tuple(f"{request_id}:{i}" for i in range(num_samples))
    return WorkItem(request_id, tenant, "Sample",
                    SampleOp(work, ids, source=source, model_id=model_id),  # type: ignore[arg-type]
                    sampler_key=key)


def save(model_id: str, seq: int, stores: Stores, name: str, tenant: str = "alice") -> WorkItem:
    """A ``save_state`` op writing checkpoint ``name`` of ``model_id``."""
    from loraplex.domain.ids import TinkerPath
    from loraplex.domain.ops import SaveOp

    pending = stores.checkpoints.allocate(TinkerPath(model_id, "weights", name), tenant,
                                          ttl_seconds=None, overwrite=False)
    return WorkItem(rid(), tenant, "SaveWeights", SaveOp(model_id, pending, True),
                    model_id=model_id, seq_id=seq)


def step(scheduler: Scheduler) -> object:
    """Run one plan; returns it (None when idle)."""
    plan = scheduler.plan()
    if plan is not None:
        scheduler.complete(plan, run_plan(scheduler.executor, plan))
    return plan
