"""Saves and checkpoint reads run on IO threads: a slow one never holds back other tenants'
cycles, and its own model's later ops still wait for it (a real clock loop and IO threads)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from loraplex.config import SchedulerConfig
from loraplex.domain.results import PreparedAdapter, SaveResult
from loraplex.domain.work import LoadWork, SaveWork
from loraplex.scheduler.assembly import build_scheduler
from loraplex.scheduler.clock import ClockLoop
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.io_workers import ThreadedIo
from loraplex.scheduler.runner import run_plan
from loraplex.scheduler.scheduler import Scheduler
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import create, fwd_bwd, optim, sample, save

WAIT_S = 20.0


@dataclass
class GatedToy(ToyExecutor):
    """A toy engine whose file work waits until the test opens its gate."""

    gate: threading.Event = field(default_factory=threading.Event)
    in_io: threading.Event = field(default_factory=threading.Event)

    def save_adapter(self, work: SaveWork) -> SaveResult:
        self.in_io.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return super().save_adapter(work)

    def read_checkpoint(self, work: LoadWork) -> PreparedAdapter:
        self.in_io.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return super().read_checkpoint(work)


@pytest.fixture
def running(stores: Stores) -> Iterator[tuple[Scheduler, GatedToy]]:
    toy = GatedToy()
    futures = FutureStore(ttl_s=3600, journal=stores.futures)
    effects = Effects(stores.runs, stores.checkpoints, stores.samplers, stores.sequences)
    scheduler = build_scheduler(toy, SchedulerConfig(), futures, effects, io=ThreadedIo(2))
    loop = ClockLoop(scheduler)
    loop.start()
    yield scheduler, toy
    toy.gate.set()
    loop.stop()


def wait_done(s: Scheduler, request_id: str, tenant: str = "alice") -> None:
    done = threading.Event()
    s.futures.subscribe(request_id, done.set)
    assert done.wait(WAIT_S), f"{request_id} did not finish"
    entry = s.futures.get(request_id, tenant)
    assert entry.error is None, entry.error


def test_a_slow_save_does_not_hold_back_another_tenants_step(
        running: tuple[Scheduler, GatedToy], stores: Stores) -> None:
    s, toy = running
    for item in (create("a:train:0"), create("b:train:0", tenant="bob")):
        s.submit(item)
        wait_done(s, item.request_id, item.tenant)
    slow = save("a:train:0", 1, stores, "slow")
    after = fwd_bwd("a:train:0", 2)
    s.submit(slow)
    s.submit(after)
    assert toy.in_io.wait(WAIT_S)
    cycles_before = s.metrics.calls["cycle"]
    step = [fwd_bwd("b:train:0", 1, tenant="bob"), optim("b:train:0", 2, tenant="bob")]
    for item in step:
        s.submit(item)
    for item in step:
        wait_done(s, item.request_id, "bob")
    assert s.metrics.calls["cycle"] - cycles_before == 1, "bob's step took one cycle"
    assert not s.futures.get(slow.request_id, "alice").is_done, "the save is still writing"
    assert not s.futures.get(after.request_id, "alice").is_done, "alice's next op waits for it"
    toy.gate.set()
    wait_done(s, slow.request_id)
    wait_done(s, after.request_id)
    assert stores.checkpoints.list_for_run("a:train:0")[0].path.name == "slow"
    kinds = [c.kind for c in s.metrics.recent()]
    assert kinds.index("io") < len(kinds) - 1 - kinds[::-1].index("cycle"), \
        "alice's op ran after the save finished"


def test_a_slow_checkpoint_read_for_sampling_does_not_hold_back_other_samples(
        running: tuple[Scheduler, GatedToy], stores: Stores) -> None:
    s, toy = running
    s.submit(item := create("a:train:0"))
    wait_done(s, item.request_id)
    toy.gate.set()
    s.submit(item := save("a:train:0", 1, stores, "ckpt"))
    wait_done(s, item.request_id)
    record = stores.checkpoints.list_for_run("a:train:0")[0]
    toy.gate.clear()
    toy.in_io.clear()
    from_ckpt = sample([2, 3, 4], adapter_id="ckpt:a", source="checkpoint")
    from_ckpt = _with_dir(from_ckpt, record.directory)
    s.submit(from_ckpt)
    assert toy.in_io.wait(WAIT_S)
    s.submit(base := sample([5, 6], tenant="bob"))
    wait_done(s, base.request_id, "bob")
    assert not s.futures.get(from_ckpt.request_id, "alice").is_done
    toy.gate.set()
    wait_done(s, from_ckpt.request_id)
    assert toy.has_adapter("ckpt:a")


def test_an_unreadable_sampler_checkpoint_fails_its_samples_alone(
        running: tuple[Scheduler, GatedToy], tmp_path: object) -> None:
    s, toy = running
    toy.gate.set()
    bad = _with_dir(sample([2, 3], adapter_id="ckpt:gone", source="checkpoint"), "/nonexistent")
    good = sample([2, 3], tenant="bob")
    s.submit(bad)
    s.submit(good)
    wait_done(s, good.request_id, "bob")
    done = threading.Event()
    s.futures.subscribe(bad.request_id, done.set)
    assert done.wait(WAIT_S)
    error = s.futures.get(bad.request_id, "alice").error
    assert error is not None and error.category == "user" and "no adapter checkpoint" in str(error)


def _with_dir(item, directory: str):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    op = item.op
    return replace(item, op=replace(op, work=replace(op.work, adapter_dir=directory)))


class LockWatchingToy(ToyExecutor):
    """A toy engine that records every residency question asked while a lock it is given
    is held (the scheduler's: planning must never make an executor call under it)."""

    lock: threading.Lock | None = None
    asked_under_lock: int = 0
    reads: int = 0

    def has_adapter(self, adapter_id: str) -> bool:
        if self.lock is not None and self.lock.locked():
            self.asked_under_lock += 1
        return super().has_adapter(adapter_id)

    def read_checkpoint(self, work: LoadWork) -> PreparedAdapter:
        self.reads += 1
        return super().read_checkpoint(work)


def test_planning_asks_the_executor_nothing_about_residency(stores: Stores) -> None:
    """Samples of a checkpoint wait for its read without the scheduler asking the executor
    (a blocking remote call for a Ray worker) whether the adapter is resident, and the next
    samples of it are admitted without reading it again."""
    from tests.scheduler.work_builders import make_scheduler

    toy = LockWatchingToy()
    s = make_scheduler(toy, stores)
    toy.lock = s.lock
    s.submit(create("a:train:0"))
    while (plan := s.plan()) is not None:
        s.complete(plan, run_plan(toy, plan))
    s.submit(save("a:train:0", 1, stores, "ckpt"))
    while (plan := s.plan()) is not None:
        s.complete(plan, run_plan(toy, plan))
    directory = stores.checkpoints.list_for_run("a:train:0")[0].directory
    for _ in range(2):
        for _ in range(3):
            s.submit(_with_dir(sample([2, 3, 4], adapter_id="ckpt:a", source="checkpoint"),
                               directory))
        while (plan := s.plan()) is not None:
            s.complete(plan, run_plan(toy, plan))
    assert toy.asked_under_lock == 0
    assert toy.reads == 1, "read once, then known to be installed"
    assert toy.has_adapter("ckpt:a") and s.futures.num_pending() == 0
