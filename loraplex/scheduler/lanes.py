"""The lanes of one base model: one `Scheduler` (with its own clock loop) per engine worker,
and the routing between them. The API talks to `Lanes` as it would to one scheduler.

Placement (`place`): a new training run goes to the live lane with the most free adapter
memory (the worker's budget minus what its resident adapters take; unbounded budgets count as
equal), then the fewest live runs, then the fewest queued ops; it stays there. Its ops, its
sampler snapshots and the samples of them follow it (the snapshot lives beside the adapter).
Samples of a checkpoint go to the lane that already read that checkpoint (affinity; each
worker keeps its own prefix cache), else to the least loaded lane, which reads it. Samples of
the bare base model go to the least loaded lane. Each lane runs its own clock cycles, so one
slow worker never holds back another's.

A lost worker (`WorkerLostError` from its executor): its lane stops; every op it held fails
with a retryable error naming the checkpoint its run was restored from; each of its runs is
placed on a surviving lane and restored from its latest ``save_state`` (weights and optimizer)
before its next op runs (meanwhile it stays live, and its ops are answered with a retryable
error, so the SDK resends them with the same seq_ids); a run that never saved is gone (its next
op is refused with a clear error). A replacement worker is started in the background and joins
as a new lane once it is up; when the lost worker was the last one, the replacement is started
first and the runs are restored onto it. Nothing that a ``save_state`` acknowledged is lost,
and no op is applied twice.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from loraplex.domain.model import ModelInfo
from loraplex.domain.ops import Admitted, SampleOp, WorkItem, new_run_of
from loraplex.domain.results import AdapterMemory
from loraplex.errors import NotFoundError, WorkerLostError
from loraplex.scheduler.clock import ClockLoop
from loraplex.scheduler.evacuation import EvacuatedRun
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.restore import RestorePoint, restore_message
from loraplex.scheduler.scheduler import Scheduler
from loraplex.store.checkpoints import CheckpointStore

log = logging.getLogger("loraplex.scheduler")
SAMPLER_KEY_MEMORY = 65536


@dataclass(frozen=True)
class WorkerGroup:
    """The engine workers of one model source, how to start one more (None: no
    replacements; the in-process engine is a group of one), and what is wrong with the
    runtime they run in (None: nothing; e.g. the Ray head is lost)."""

    executors: list[BatchExecutor]
    spawn: Callable[[], BatchExecutor] | None = None
    health: Callable[[], str | None] | None = None


@dataclass
class Lane:
    """One worker's scheduler and the thread that drives it.

    Attributes:
        name: the worker's name (``w0``, ``w1``, ...; replacements get new names).
        is_alive: false once its worker was lost.
    """

    name: str
    scheduler: Scheduler
    loop: ClockLoop
    is_alive: bool = True


@dataclass
class Lanes:
    """Routing over the lanes of one base model (see the module docstring).

    Args:
        make_scheduler: a scheduler for a new worker's executor.
        checkpoints: where a lost run's latest save_state is found.
        spawn: starts a replacement worker (blocks until it is up; None: no replacements).
        health: what is wrong with the workers' runtime, if anything (`WorkerGroup.health`).
    """

    make_scheduler: Callable[[BatchExecutor], Scheduler]
    checkpoints: CheckpointStore
    spawn: Callable[[], BatchExecutor] | None = None
    health: Callable[[], str | None] | None = None
    lanes: list[Lane] = field(default_factory=list)
    retired: list[Lane] = field(default_factory=list)
    _owner: dict[str, Lane] = field(default_factory=dict)
    _checkpoint_lane: dict[str, Lane] = field(default_factory=dict)
    _restoring: set[str] = field(default_factory=set)
    _sampler_keys: OrderedDict[tuple[str, int], Lane] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _started: bool = False
    _next_name: int = 0
    mixed_compute: bool = False

    def add_worker(self, executor: BatchExecutor) -> Lane:
        """A new lane for ``executor`` (started at once if the lanes are running). A worker
        whose logprob bits would differ from the others' (`ModelInfo.compute`) is logged and
        flagged (`mixed_compute`): a sampler and a trainer on such two workers would no
        longer agree bitwise."""
        scheduler = self.make_scheduler(executor)
        compute = executor.model_info().compute
        with self._lock:
            others = {lane.scheduler.executor.model_info().compute for lane in self.lanes}
            if others and compute not in others:
                self.mixed_compute = True
                log.warning("engine worker %s computes as %r, other workers as %s: their "
                            "logprobs differ in the last bits, so samplers and trainers on "
                            "different workers no longer agree bitwise", f"w{self._next_name}",
                            compute, sorted(others))
            name = f"w{self._next_name}"
            self._next_name += 1
            lane = Lane(name, scheduler, ClockLoop(scheduler, name=f"loraplex-clock-{name}",
                                                   on_lost=self._on_lost))
            self.lanes.append(lane)
            if self._started:  # under the lock: `stop` sees it either started or not at all
                lane.loop.start()
        return lane

    def model_info(self) -> ModelInfo:
        """The base model's facts (every worker serves the same one)."""
        with self._lock:
            return self.lanes[0].scheduler.executor.model_info()

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        for lane in self._set_started(True):
            lane.loop.start()

    def stop(self) -> None:
        """Stop every lane's clock loop (saves in progress finish), then release the workers."""
        for lane in self._set_started(False):
            lane.loop.stop()
            lane.scheduler.executor.close()

    def _set_started(self, started: bool) -> list[Lane]:
        """Whether lanes added from now on start their clock loops; returns the lanes there are."""
        with self._lock:
            self._started = started
            return list(self.lanes)

    def problem(self) -> str | None:
        """Why these lanes cannot serve right now (None: at least one worker is up and its
        runtime is healthy)."""
        problem = self.health() if self.health is not None else None
        if problem is not None:
            return problem
        with self._lock:
            if not any(lane.is_alive for lane in self.lanes):
                return "no engine worker is up; a replacement is starting"
        return None

    def schedulers(self) -> list[tuple[str, Scheduler]]:
        """Every live lane's (worker name, scheduler)."""
        with self._lock:
            return [(lane.name, lane.scheduler) for lane in self.lanes if lane.is_alive]

    def all_schedulers(self) -> list[Scheduler]:
        """Live and lost lanes' schedulers (a lost one's last usage still has to be metered)."""
        with self._lock:
            return [lane.scheduler for lane in (*self.lanes, *self.retired)]

    # ---- what the API calls (the same names as a Scheduler's) -----------------------------

    def submit(self, item: WorkItem, sample_sequence_ids: tuple[str, ...] = ()) -> Admitted:
        lane = self._route(item)
        try:
            return lane.scheduler.submit(item, sample_sequence_ids)
        except BaseException:
            if new_run_of(item.op) is not None:
                with self._lock:
                    if self._owner.get(item.model_id or "") is lane:
                        del self._owner[item.model_id or ""]
            raise

    def cancel_sample(self, request_id: str) -> None:
        """Drop a sample whose client went away, on whichever lane holds it."""
        for scheduler in self.all_schedulers():
            if scheduler.cancel_sample(request_id):
                return

    def previous_admission(self, model_id: str, seq_id: int) -> Admitted | None:
        lane = self._owned(model_id)
        return None if lane is None else lane.scheduler.previous_admission(model_id, seq_id)

    def has_model(self, model_id: str) -> bool:
        """The run is live: on a lane, or being moved off a lost one (its ops are answered
        with the retryable "being restored" error meanwhile, so the SDK resends them; a
        "not live" answer would make it give up their seq_ids and stall the run behind the
        gap). Asked again when its lane was lost while this looked."""
        while True:
            with self._lock:
                if model_id in self._restoring:
                    return True
                lane = self._owner.get(model_id)
            if lane is None:
                return False
            if lane.scheduler.has_model(model_id):
                return True
            with self._lock:
                if lane.is_alive:  # a live lane that closed the run: it is gone
                    return False

    def release_model(self, model_id: str) -> None:
        with self._lock:
            lane = self._owner.pop(model_id, None)
        if lane is not None:
            lane.scheduler.release_model(model_id)

    def num_models(self, tenant: str) -> int:
        return sum(s.num_models(tenant) for _, s in self.schedulers())

    def queue_state(self, tenant: str) -> str:
        states = {s.queue_state(tenant) for _, s in self.schedulers()}
        for state in ("paused_rate_limit", "paused_capacity"):  # the most severe one
            if state in states:
                return state
        return "active"

    def drop_sampler_adapters(self, prefix: str) -> None:
        for _, scheduler in self.schedulers():
            scheduler.drop_sampler_adapters(prefix)

    # ---- routing ----------------------------------------------------------------------------

    def _route(self, item: WorkItem) -> Lane:
        if item.model_id is not None:
            if new_run_of(item.op) is not None:
                return self._claim(item.model_id, self.place())
            with self._lock:
                if item.model_id in self._restoring:  # HTTP 500: the SDK resubmits
                    raise WorkerLostError(f"training run {item.model_id!r} is being restored "
                                          "on another worker; retry")
            lane = self._owned(item.model_id)
            if lane is None:
                raise NotFoundError(f"model_id: no live training run {item.model_id!r}",
                                    field="model_id")
            return lane
        assert isinstance(item.op, SampleOp), "only samples have no model id"
        return self._sample_lane(item, item.op)

    def place(self) -> Lane:
        """The lane a new training run should live on (policy in the module docstring)."""
        with self._lock:
            live = [lane for lane in self.lanes if lane.is_alive]
            if not live:
                raise WorkerLostError("no engine worker is up; a replacement is starting, "
                                      "retry")
            runs = {lane.name: sum(1 for o in self._owner.values() if o is lane)
                    for lane in live}
        memory = {}
        for lane in live:
            try:
                memory[lane.name] = lane.scheduler.executor.adapter_memory()
            except WorkerLostError:  # dying too: its own clock loop will find out
                continue
        answering = [lane for lane in live if lane.name in memory]
        if not answering:
            raise WorkerLostError("no engine worker answers; a replacement is starting, retry")
        return max(answering, key=lambda lane: (_free(memory[lane.name]), -runs[lane.name],
                                                -lane.scheduler.num_queued()))

    def _claim(self, model_id: str, lane: Lane) -> Lane:
        with self._lock:
            self._owner[model_id] = lane
        return lane

    def _sample_lane(self, item: WorkItem, op: SampleOp) -> Lane:
        with self._lock:
            if item.sampler_key is not None and item.sampler_key in self._sampler_keys:
                lane = self._sampler_keys[item.sampler_key]  # a retried submit: same lane
                if lane.is_alive:
                    return lane
            lane = self._affine_lane(op) or self._least_loaded()
            if item.sampler_key is not None:
                self._sampler_keys[item.sampler_key] = lane
                while len(self._sampler_keys) > SAMPLER_KEY_MEMORY:
                    self._sampler_keys.popitem(last=False)
            if op.source == "checkpoint" and op.work.adapter_id is not None:
                self._checkpoint_lane[op.work.adapter_id] = lane
            return lane

    def _affine_lane(self, op: SampleOp) -> Lane | None:
        """The lane that holds this sample's adapter, if one does (lock held)."""
        if op.source in ("snapshot", "inflight") and op.model_id is not None:
            lane = self._owner.get(op.model_id)
        elif op.source == "checkpoint" and op.work.adapter_id is not None:
            lane = self._checkpoint_lane.get(op.work.adapter_id)
        else:
            lane = None
        return lane if lane is not None and lane.is_alive else None

    def _least_loaded(self) -> Lane:
        live = [lane for lane in self.lanes if lane.is_alive]
        if not live:
            raise WorkerLostError("no engine worker is up; a replacement is starting, retry")
        return min(live, key=lambda lane: lane.scheduler.num_queued())

    def _owned(self, model_id: str) -> Lane | None:
        with self._lock:
            return self._owner.get(model_id)

    # ---- a lost worker ----------------------------------------------------------------------

    def _on_lost(self, scheduler: Scheduler) -> None:
        """Runs on the lost lane's clock thread once its loop has stopped."""
        with self._lock:
            lane = next(lane for lane in self.lanes if lane.scheduler is scheduler)
            lane.is_alive = False
            self.lanes.remove(lane)
            self.retired.append(lane)
            orphans = [m for m, owner in self._owner.items() if owner is lane]
            for model_id in orphans:
                del self._owner[model_id]
            self._restoring.update(orphans)
            self._checkpoint_lane = {a: o for a, o in self._checkpoint_lane.items()
                                     if o is not lane}
        cause = scheduler.lost or WorkerLostError(f"engine worker {lane.name} was lost")
        log.error("engine worker %s lost (%s); moving its %d training runs", lane.name, cause,
                  len(orphans))
        runs = scheduler.evacuate()
        points = {run.model_id: RestorePoint.latest(self.checkpoints, run.model_id)
                  for run in runs.runs}
        with self._lock:  # a run that never saved is gone: its next op is refused for good
            self._restoring.difference_update(m for m, p in points.items() if p is None)
        scheduler.fail_evacuated(runs.items, lambda item: WorkerLostError(restore_message(
            lane.name, item, points.get(item.model_id or ""))))
        with self._lock:
            survivors = any(other.is_alive for other in self.lanes)
        replaced = False
        if not survivors and any(p is not None for p in points.values()):
            replaced = self._replace_now(lane)  # nowhere to restore to until it is up
        for run in runs.runs:
            self._readopt(run, points[run.model_id])
        with self._lock:
            self._restoring.difference_update(orphans)
        if not replaced:
            self._replace(lane)

    def _replace_now(self, lost: Lane) -> bool:
        """Start a replacement for ``lost`` and wait for it (the lost lane was the last one:
        its runs are restored onto the replacement, their ops answered "being restored"
        meanwhile). False when none could be started."""
        if self.spawn is None:
            return False
        try:
            executor = self.spawn()
        except Exception:
            log.exception("could not start a replacement for worker %s", lost.name)
            return False
        lane = self.add_worker(executor)
        log.info("worker %s replaces %s", lane.name, lost.name)
        return True

    def _readopt(self, run: EvacuatedRun, point: RestorePoint | None) -> None:
        if point is None:
            log.error("training run %s had no save_state: its state is lost", run.model_id)
            return
        try:
            lane = self.place()
        except WorkerLostError:
            log.error("no worker left to restore %s on", run.model_id)
            return
        lane.scheduler.adopt(run, point.load_work(run.model_id), point.path)
        self._claim(run.model_id, lane)

    def _replace(self, lost: Lane) -> None:
        if self.spawn is None:
            return
        spawn = self.spawn

        def start() -> None:
            try:
                executor = spawn()
            except Exception:
                log.exception("could not start a replacement for worker %s", lost.name)
                return
            lane = self.add_worker(executor)
            log.info("worker %s replaces %s", lane.name, lost.name)

        threading.Thread(target=start, name=f"loraplex-replace-{lost.name}", daemon=True
                         ).start()


def _free(memory: AdapterMemory) -> float:
    """Free adapter memory of a worker (an unbounded budget: infinite, so ties go on)."""
    if memory.budget_bytes is None:
        return float("inf")
    return float(memory.budget_bytes - memory.bytes_resident)
