"""Lanes: placement, routing by owner and affinity, and a lost worker — its ops fail with a
retryable error naming the restore checkpoint, its runs continue elsewhere from their latest
save_state, other tenants never notice, a replacement joins. Toy workers on real clock loops."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from loraplex.config import SchedulerConfig
from loraplex.domain.ops import LoadOp, WorkItem
from loraplex.domain.results import AdapterMemory
from loraplex.domain.work import LoadWork
from loraplex.errors import LoraplexError, WorkerLostError
from loraplex.scheduler.assembly import build_scheduler
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.lanes import Lanes
from loraplex.scheduler.scheduler import Scheduler
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import create, fwd_bwd, optim, rid, sample, save

WAIT_S = 20.0


@dataclass
class MortalToy(ToyExecutor):
    """A toy worker that can die: every call after `kill` raises WorkerLostError."""

    name: str = "toy"
    dead: bool = False
    budget: int | None = None
    gate: threading.Event | None = None  # set: `adapter_memory` waits for it (placement)
    asked: threading.Event = field(default_factory=threading.Event)
    read_gate: threading.Event | None = None  # set: `read_checkpoint` answers once it opens
    reading: threading.Event = field(default_factory=threading.Event)

    def kill(self) -> None:
        self.dead = True

    def _alive(self) -> None:
        if self.dead:
            raise WorkerLostError(f"engine worker {self.name} was lost (killed)")

    def forward_backward(self, works):  # type: ignore[no-untyped-def]
        self._alive()
        return super().forward_backward(works)

    def optim_step(self, works):  # type: ignore[no-untyped-def]
        self._alive()
        return super().optim_step(works)

    def sample_step(self, admit, max_decode_steps, cancel=()):  # type: ignore[no-untyped-def]
        self._alive()
        return super().sample_step(admit, max_decode_steps, cancel)

    def read_checkpoint(self, work):  # type: ignore[no-untyped-def]
        self.reading.set()
        if self.read_gate is not None:
            assert self.read_gate.wait(WAIT_S), "the test never opened the read gate"
        return super().read_checkpoint(work)  # read before the kill: it answers

    def release_memory(self) -> None:
        self._alive()
        super().release_memory()

    def adapter_memory(self) -> AdapterMemory:
        self.asked.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return AdapterMemory(len(self._adapters), 8 * len(self._adapters), self.budget)


@pytest.fixture
def pool(stores: Stores) -> Iterator[tuple[Lanes, list[MortalToy]]]:
    futures = FutureStore(ttl_s=3600, journal=stores.futures)
    effects = Effects(stores.runs, stores.checkpoints, stores.samplers, stores.sequences)
    made: list[MortalToy] = []

    def spawn() -> MortalToy:
        toy = MortalToy(name=f"toy{len(made)}")
        made.append(toy)
        return toy

    def make_scheduler(executor: MortalToy) -> Scheduler:
        return build_scheduler(executor, SchedulerConfig(), futures, effects)

    make_scheduler.futures = futures  # type: ignore[attr-defined]
    lanes = Lanes(make_scheduler, stores.checkpoints, spawn)
    for _ in range(2):
        lanes.add_worker(spawn())
    lanes.start()
    yield lanes, made
    lanes.stop()


def run(lanes: Lanes, item: WorkItem) -> object:
    """Submit (retrying while a run is being restored, as the SDK retries the HTTP 500 this
    answers) and wait; returns the result (raises the future's error)."""
    for _ in range(200):
        try:
            lanes.submit(item)
            break
        except WorkerLostError as exc:
            if "being restored" not in str(exc):
                raise
            threading.Event().wait(0.01)
    return wait_for(lanes, item)


def wait_for(lanes: Lanes, item: WorkItem) -> object:
    """Wait for a submitted op; returns its result (raises the future's error)."""
    futures = lanes.make_scheduler.futures  # type: ignore[attr-defined]  # the shared store
    done = threading.Event()
    futures.subscribe(item.request_id, done.set)
    assert done.wait(WAIT_S), f"{item.kind} did not finish"
    entry = futures.get(item.request_id, item.tenant)
    if entry.error is not None:
        raise entry.error
    return entry.result


def test_runs_are_spread_and_each_op_goes_to_its_runs_lane(
        pool: tuple[Lanes, list[MortalToy]]) -> None:
    lanes, toys = pool
    run(lanes, create("a:train:0", tenant="alice"))
    run(lanes, create("b:train:0", tenant="bob"))
    assert {toys[0].has_adapter("a:train:0"), toys[1].has_adapter("a:train:0")} == {True, False}
    assert toys[0].has_adapter("a:train:0") != toys[0].has_adapter("b:train:0"), "one each"
    run(lanes, fwd_bwd("a:train:0", 1, tenant="alice"))
    owner = toys[0] if toys[0].has_adapter("a:train:0") else toys[1]
    assert ("forward_backward", ("a:train:0",)) in owner.calls
    assert lanes.has_model("a:train:0") and not lanes.has_model("nobody:train:0")


def test_placement_prefers_the_worker_with_the_most_free_adapter_memory(
        pool: tuple[Lanes, list[MortalToy]]) -> None:
    lanes, toys = pool
    toys[0].budget, toys[1].budget = 100, 1000
    for i in range(3):
        run(lanes, create(f"r{i}:train:0"))
    assert all(toys[1].has_adapter(f"r{i}:train:0") for i in range(3))


def test_a_lost_worker_costs_nothing_a_save_state_acknowledged(
        pool: tuple[Lanes, list[MortalToy]], stores: Stores) -> None:
    lanes, toys = pool
    run(lanes, create("a:train:0", tenant="alice"))
    run(lanes, create("b:train:0", tenant="bob"))
    a_toy = toys[0] if toys[0].has_adapter("a:train:0") else toys[1]
    for seq in (1, 3):
        run(lanes, fwd_bwd("a:train:0", seq, tenant="alice"))
        run(lanes, optim("a:train:0", seq + 1, tenant="alice"))
    run(lanes, save("a:train:0", 5, stores, "ckpt", tenant="alice"))
    theta_saved = a_toy.theta("a:train:0")
    run(lanes, fwd_bwd("a:train:0", 6, tenant="alice"))
    run(lanes, optim("a:train:0", 7, tenant="alice"))  # a step after the save: lost with it
    a_toy.kill()
    with pytest.raises(WorkerLostError, match=r"restored from tinker://a:train:0/weights/ckpt"):
        run(lanes, fwd_bwd("a:train:0", 8, tenant="alice"))
    # bob's run (on the other worker) never noticed; alice's next op runs on the restored run
    run(lanes, fwd_bwd("b:train:0", 1, tenant="bob"))
    run(lanes, fwd_bwd("a:train:0", 9, tenant="alice"))  # runs after the restore
    survivor = next(t for t in toys if not t.dead and t.has_adapter("a:train:0"))
    assert survivor.theta("a:train:0") == theta_saved, "restored bitwise from the checkpoint"
    run(lanes, optim("a:train:0", 10, tenant="alice"))
    assert survivor.theta("a:train:0") != theta_saved
    for _ in range(100):  # the replacement worker joins
        if len(lanes.schedulers()) == 2:
            break
        threading.Event().wait(0.05)
    assert len(lanes.schedulers()) == 2 and len(toys) == 3
    assert stores.checkpoints.list_for_run("a:train:0")[0].path.name == "ckpt"


def test_a_run_being_moved_stays_live_so_its_next_op_is_retried_not_refused(
        pool: tuple[Lanes, list[MortalToy]], stores: Stores) -> None:
    """Between a worker's loss and its run's restore on another worker (here: held while the
    survivor is asked for its free memory), the run must stay live for the API's check
    (`has_model`, what `live_run` asks before a training op takes its seq slot): its op gets
    the retryable 'being restored' error (the SDK resends that seq_id), never the user error
    'no live state' (the SDK gives that seq_id up, and every later op of the run would wait
    behind the gap until the gap timeout)."""
    lanes, toys = pool
    run(lanes, create("a:train:0", tenant="alice"))
    run(lanes, create("b:train:0", tenant="bob"))
    a_toy, survivor = toys if toys[0].has_adapter("a:train:0") else toys[::-1]
    run(lanes, save("a:train:0", 1, stores, "ckpt", tenant="alice"))
    survivor.gate, survivor.asked = threading.Event(), threading.Event()
    a_toy.kill()
    with pytest.raises(WorkerLostError, match="restored from"):
        run(lanes, fwd_bwd("a:train:0", 2, tenant="alice"))  # failed before the restore
    assert survivor.asked.wait(WAIT_S), "the restore never asked where to place the run"
    assert lanes.has_model("a:train:0"), "a run being moved must not look gone"
    with pytest.raises(WorkerLostError, match="being restored"):
        lanes.submit(fwd_bwd("a:train:0", 3, tenant="alice"))
    survivor.gate.set()
    run(lanes, fwd_bwd("a:train:0", 3, tenant="alice"))  # the resent seq_id: no gap
    run(lanes, optim("a:train:0", 4, tenant="alice"))
    assert ("optim_step", ("a:train:0",)) in survivor.calls
    assert lanes.has_model("a:train:0")


def test_a_load_read_just_before_its_worker_was_lost_fails_instead_of_waiting_forever(
        pool: tuple[Lanes, list[MortalToy]], stores: Stores) -> None:
    """A load_state whose checkpoint read answers after the lane found its worker lost (by
    another run's op) and handed everything over: its install can never run there, so it
    fails with a retryable error instead of leaving its future pending for good."""
    lanes, toys = pool
    toys[1].budget = 0  # no free adapter memory: both runs go to toys[0]
    run(lanes, create("a:train:0", tenant="alice"))
    run(lanes, create("b:train:0", tenant="bob"))
    toy = toys[0]
    assert toy.has_adapter("a:train:0") and toy.has_adapter("b:train:0")
    run(lanes, save("a:train:0", 1, stores, "ckpt", tenant="alice"))
    toy.read_gate = threading.Event()
    record = stores.checkpoints.list_for_run("a:train:0")[0]
    work = LoadWork("a:train:0", record.directory, with_optimizer=True)
    load = WorkItem(rid(), "alice", "LoadWeights", LoadOp(work, record.path),
                    model_id="a:train:0", seq_id=2)
    lanes.submit(load)
    assert toy.reading.wait(WAIT_S), "the load's read never started"
    toy.kill()
    with pytest.raises(WorkerLostError):  # bob's op finds the loss: the lane hands over
        run(lanes, fwd_bwd("b:train:0", 1, tenant="bob"))
    toy.read_gate.set()
    with pytest.raises(WorkerLostError, match="retry"):
        wait_for(lanes, load)


def test_a_run_that_never_saved_is_gone_with_its_worker(
        pool: tuple[Lanes, list[MortalToy]]) -> None:
    lanes, toys = pool
    run(lanes, create("c:train:0", tenant="carol"))
    c_toy = toys[0] if toys[0].has_adapter("c:train:0") else toys[1]
    c_toy.kill()
    with pytest.raises(WorkerLostError, match="had no save_state"):
        run(lanes, fwd_bwd("c:train:0", 1, tenant="carol"))
    with pytest.raises(LoraplexError, match="no live training run"):
        lanes.submit(fwd_bwd("c:train:0", 2, tenant="carol"))


def test_base_samples_go_to_the_least_loaded_worker_and_survive_a_loss(
        pool: tuple[Lanes, list[MortalToy]]) -> None:
    lanes, toys = pool
    toys[0].kill()
    outcomes = []
    for _ in range(4):  # the first on the dead lane fails retryably; the rest run elsewhere
        try:
            outcomes.append(run(lanes, sample([2, 3, 4], tenant="dave")))
        except WorkerLostError as exc:
            assert "retry" in str(exc)
    assert len(outcomes) >= 3


def test_a_worker_computing_other_bits_is_flagged_and_a_dead_one_is_reported_lost(
        pool: tuple[Lanes, list[MortalToy]], stores: Stores,
        caplog: pytest.LogCaptureFixture) -> None:
    """Two workers whose logprob bits would differ (`ModelInfo.compute`) make the lanes log a
    warning and set `mixed_compute`; `/stats`'s worker entry shows each one's compute and a
    dead worker as lost instead of failing the whole answer."""
    from loraplex.api.lane_views import LaneView
    from loraplex.api.routes.stats import worker_json

    lanes, _ = pool
    assert not lanes.mixed_compute, "two workers that compute alike"
    with caplog.at_level("WARNING", logger="loraplex.scheduler"):
        lanes.add_worker(MortalToy(name="other", compute="cpu float32 gemm=torch"))
    assert lanes.mixed_compute
    assert "no longer agree bitwise" in caplog.text and "gemm=torch" in caplog.text
    name, scheduler = lanes.schedulers()[0]
    assert worker_json(LaneView(scheduler, name, ["m"]))["compute"] == "toy"
    dead = build_scheduler(DeadToy(), SchedulerConfig(), FutureStore(ttl_s=60), Effects(
        stores.runs, stores.checkpoints, stores.samplers, stores.sequences))
    lost = worker_json(LaneView(dead, "w9", ["m"]))
    assert lost["memory"] is None and "was lost" in lost["lost"]


class DeadToy(ToyExecutor):
    def adapter_memory(self) -> AdapterMemory:
        raise WorkerLostError("engine worker w9 was lost (ActorDiedError)")


def test_an_idle_worker_that_dies_is_noticed_and_replaced(
        pool: tuple[Lanes, list[MortalToy]], stores: Stores) -> None:
    """A worker with nothing to do dies: its lane's idle liveness check (the clock loop's
    `release_memory`) finds it within about a second, its saved run moves to the survivor
    and a replacement joins, before any op of that run arrives."""
    lanes, toys = pool
    run(lanes, create("a:train:0", tenant="alice"))
    run(lanes, save("a:train:0", 1, stores, "ckpt", tenant="alice"))
    a_toy = toys[0] if toys[0].has_adapter("a:train:0") else toys[1]
    a_toy.kill()
    survivor = next(t for t in toys[:2] if t is not a_toy)
    for _ in range(200):  # the replacement joins and the restore onto the survivor lands
        if (len(toys) == 3 and len(lanes.schedulers()) == 2
                and survivor.has_adapter("a:train:0")):
            break
        threading.Event().wait(0.05)
    assert len(toys) == 3 and len(lanes.schedulers()) == 2, "noticed and replaced"
    assert survivor.has_adapter("a:train:0"), "the run moved without waiting for an op"
