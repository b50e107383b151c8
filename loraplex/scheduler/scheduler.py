"""The scheduler: a state machine over per-model queues and the sampling queue.

    submit(item)          any thread: dedupe, admission, queue, create the future
    plan(now) -> Plan     clock thread: pick the next engine call and mark its items started
    complete(plan, out)   clock thread: apply effects, resolve futures, advance queues

Ordering (with `ModelQueue`): ops of one model start in seq_id order and only after every
earlier op of the model finished; a save / load / create / snapshot runs alone, after all
earlier ops of its model; sampling requests have no order.

Policy (`Planner`, the one place it lives): file work on IO threads, then releases, installs
and expired seq gaps, then training (clock cycles and control ops) and sampling sharing the
engine by engine time. The state submitting, planning and finishing share (queues, sampling
queue, residency, in-flight counts, installs, the lock) is one `SchedulerState`. `assembly`
builds it and hands it to the `Scheduler`, the `Planner` and the `Completion`; this module and
completion.py do not import each other (the scheduler reaches that half through `Finishing`).

Admission: a tenant with ``max_inflight_per_tenant`` queued or running ops gets CapacityError
(HTTP 429) for new samples and for training ops that do not fill the gap its queue waits on.
Finishing an op (`Completion`) applies its effects, resolves its future and meters it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from loraplex.config import SchedulerConfig
from loraplex.domain.ids import TinkerPath
from loraplex.domain.ops import Admitted, InstallPlan, LoadOp, Plan, PlanStart, WorkItem, new_run_of
from loraplex.domain.sampling import cancelled_error
from loraplex.domain.usage import OpUsage
from loraplex.domain.work import LoadWork
from loraplex.errors import CapacityError, LoraplexError, NotFoundError, WorkerLostError
from loraplex.scheduler.evacuation import EvacuatedRun, Evacuation, evacuate
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.io_workers import IoWorkers
from loraplex.scheduler.metrics import SchedulerMetrics
from loraplex.scheduler.model_queue import ModelQueue
from loraplex.scheduler.planner import Planner
from loraplex.scheduler.residency import AdapterResidency, sample_op
from loraplex.scheduler.runner import PlanOutcome
from loraplex.scheduler.scheduler_state import SchedulerState
from loraplex.scheduler.step_log import StepLog
from loraplex.scheduler.usage import UsageLog
from loraplex.scheduler.work_choice import WorkChoice

SAMPLE_DEDUPE_MEMORY = 65536


class Finishing(Protocol):
    """The half of the state machine that finishes ops: `completion.Completion`, which
    `assembly.build_scheduler` hands in (named here so the two modules need not import each
    other)."""

    def complete(self, plan: Plan, outcome: PlanOutcome
                 ) -> tuple[list[WorkItem], list[OpUsage]]: ...

    def installed_sampler_adapters(self, plan: InstallPlan, outcome: PlanOutcome) -> None: ...

    def fail_unstarted(self, failures: Iterable[tuple[WorkItem, LoraplexError, str | None]]
                       ) -> None: ...


@dataclass(frozen=True)
class SchedulerParts:
    """What a `Scheduler` is made of (`assembly.build_scheduler` builds them): the state its
    halves share, the planning half and its policy, the finishing half, where saves and reads
    run, and the logs and metrics finished ops are recorded in."""

    state: SchedulerState
    choice: WorkChoice
    planner: Planner
    finishing: Finishing
    io: IoWorkers
    usage: UsageLog
    steps: StepLog
    metrics: SchedulerMetrics


class Scheduler:
    """Schedules all work on one base model's executor (built by `assembly.build_scheduler`).

    Args:
        executor: the engine (or a fake) for this base model.
        config: the scheduler's config slice.
        futures: the server-wide future store.
        parts: its shared state, halves, IO workers and logs.
        clock: monotonic seconds (tests inject their own).
    """

    def __init__(self, executor: BatchExecutor, config: SchedulerConfig, futures: FutureStore,
                 parts: SchedulerParts, clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.config = config
        self.futures = futures
        self.usage = parts.usage
        self.steps = parts.steps
        self.metrics = parts.metrics
        self.io = parts.io
        self._clock = clock
        self._state = parts.state
        self._sample_seen: OrderedDict[tuple[str, int], Admitted] = OrderedDict()
        self._choice = parts.choice
        self._lost_plan: Plan | None = None
        self._done = parts.finishing
        self._planner = parts.planner

    @property
    def lock(self) -> threading.Lock:
        """The lock guarding the scheduler's state."""
        return self._state.lock

    @property
    def residency(self) -> AdapterResidency:
        return self._state.residency

    @property
    def lost(self) -> WorkerLostError | None:
        """Set once the worker died: the lane hands everything over."""
        return self._state.lost

    # ---- submission (event-loop thread) -------------------------------------------------

    def submit(self, item: WorkItem, sample_sequence_ids: tuple[str, ...] = ()) -> Admitted:
        """Queue a work item and create its future.

        Returns:
            the admission (the original one when this is a retried submit).

        Raises:
            NotFoundError / UserError: the model is not live, or the seq_id is stale.
            CapacityError: the tenant is over its in-flight limit.
        """
        admitted = Admitted(item.request_id, sample_sequence_ids)
        item = replace(item, enqueued_at=self._clock())
        with self._state.lock:
            if self._state.lost is not None:  # HTTP 500: the SDK resubmits, to a live lane
                raise WorkerLostError(f"{self._state.lost.message}; resubmit")
            try:
                if item.model_id is not None:
                    duplicate = self._offer_training(item, admitted)
                else:
                    item, duplicate = self._offer_sample(item, admitted)
            except CapacityError as exc:
                self.metrics.rejected(item.tenant, item.kind, exc.message)
                raise
            if duplicate is not None:
                return duplicate
            self._state.inflight[item.tenant] += 1
            self.futures.create(item.request_id, item.tenant, item.kind)
            self._state.notify_locked()
        return admitted

    def _offer_training(self, item: WorkItem, admitted: Admitted) -> Admitted | None:
        model_id, seq, state = item.model_id, item.seq_id, self._state
        assert model_id is not None and seq is not None
        queue = state.queues.get(model_id)
        new_run = new_run_of(item.op)
        if queue is None and new_run is not None:
            queue = state.queues[model_id] = ModelQueue(
                model_id, item.tenant, base_model=new_run.base_model, now=item.enqueued_at,
                max_ahead=self.config.max_seq_ahead)
        if queue is None or queue.tenant != item.tenant or model_id in state.closing:
            raise NotFoundError(f"model_id: no live training run {model_id!r}", field="model_id")
        previous = queue.admitted_for(seq)
        if previous is not None:
            return previous
        if self._over_limit(item.tenant) and seq != queue.next_seq:
            # the op a queue waits on is never refused: its chunks arrive out of order
            raise CapacityError(f"tenant has {state.inflight[item.tenant]} ops in flight; retry")
        self.futures.check_room(item.tenant)
        queue.offer(item, admitted)
        return None

    def _offer_sample(self, item: WorkItem,
                      admitted: Admitted) -> tuple[WorkItem, Admitted | None]:
        key = item.sampler_key
        if key is not None and key in self._sample_seen:
            return item, self._sample_seen[key]
        self._check_room(item.tenant)
        item = replace(item, op=self._state.residency.bind(sample_op(item)))
        self._state.samples.add(item)
        if key is not None:
            self._sample_seen[key] = admitted
            while len(self._sample_seen) > SAMPLE_DEDUPE_MEMORY:
                self._sample_seen.popitem(last=False)
        return item, None

    def _over_limit(self, tenant: str) -> bool:
        return self._state.inflight[tenant] >= self.config.max_inflight_per_tenant

    def _check_room(self, tenant: str) -> None:
        """Raises CapacityError (HTTP 429, the SDK backs off) for a tenant at its in-flight
        limit or holding too many unfetched results."""
        if self._over_limit(tenant):
            raise CapacityError(f"tenant has {self._state.inflight[tenant]} ops in flight; retry")
        self.futures.check_room(tenant)

    def num_models(self, tenant: str) -> int:
        """The tenant's live training runs on this scheduler."""
        with self._state.lock:
            return sum(q.tenant == tenant and m not in self._state.closing
                       for m, q in self._state.queues.items())

    def previous_admission(self, model_id: str, seq_id: int) -> Admitted | None:
        """The admission of an earlier submit of ``(model_id, seq_id)``, if remembered."""
        with self._state.lock:
            queue = self._state.queues.get(model_id)
            return None if queue is None else queue.admitted_for(seq_id)

    def has_model(self, model_id: str) -> bool:
        with self._state.lock:
            return model_id in self._state.queues and model_id not in self._state.closing

    def release_model(self, model_id: str) -> None:
        """Drop a training run's adapters once its queued ops are done (session finished)."""
        with self._state.lock:
            self._state.close_model(model_id)

    def drop_sampler_adapters(self, prefix: str) -> None:
        """Forget the sampler adapters whose id starts with ``prefix`` (a deleted checkpoint);
        each leaves the engine once no running sample uses it."""
        with self._state.lock:
            self._state.residency.drop_prefix(prefix)
            self._state.notify_locked()

    def queue_state(self, tenant: str) -> str:
        """The SDK's queue state for the tenant's pending futures (tinker-api.md §4.2)."""
        with self._state.lock:
            if self._over_limit(tenant):
                return "paused_rate_limit"
            return "paused_capacity" if self._state.samples.num_waiting(tenant) else "active"

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per tenant: training ops waiting, samples waiting / running, ops in flight."""
        state = self._state
        with state.lock:
            out: defaultdict[str, dict[str, int]] = defaultdict(
                lambda: {"train_waiting": 0, "sample_waiting": 0, "sample_running": 0,
                         "inflight": 0})
            for queue in state.queues.values():
                out[queue.tenant]["train_waiting"] += queue.num_waiting()
            for tenant, n in state.samples.waiting_by_tenant().items():
                out[tenant]["sample_waiting"] = n
            for tenant, n in state.samples.running_by_tenant().items():
                out[tenant]["sample_running"] = n
            for tenant, n in state.inflight.items():
                out[tenant]["inflight"] = n
            return dict(out)

    def num_queued(self) -> int:
        with self._state.lock:
            return (sum(q.num_waiting() for q in self._state.queues.values())
                    + self._state.samples.num_waiting() + self._state.samples.num_running())

    # ---- the state machine (clock thread) -------------------------------------------------

    def wait_for_plan(self, timeout: float) -> Plan | None:
        """The next plan, sleeping up to ``timeout`` for a wake-up when there is none."""
        plan, generation = self._plan_and_submit(None)
        if plan is not None:
            return plan
        with self._state.lock:
            if self._state.generation == generation:
                hold_s = self._choice.hold_s
                self._state.wakeup.wait(min(timeout, hold_s) if hold_s else timeout)
        return self.plan()

    def wake(self) -> None:
        with self._state.lock:
            self._state.notify_locked()

    def close(self) -> None:
        """Let the saves and reads in progress finish (the clock loop has stopped)."""
        self.io.close()

    def plan(self, now: float | None = None) -> Plan | None:
        """The next engine call, its items marked started; None when there is nothing to do.

        Args:
            now: the caller's clock (defaults to the scheduler's; the gap timeout reads it).
        """
        return self._plan_and_submit(now)[0]

    def _plan_and_submit(self, now: float | None) -> tuple[Plan | None, int]:
        """Plan under the lock, then hand the IO jobs planning started to the IO workers
        (inline workers run them now, which may make a plan: then plan again)."""
        while True:
            with self._state.lock:
                plan = self._plan_locked(now)
                jobs = self._planner.take_jobs()
                generation = self._state.generation
            for job in jobs:
                self.io.submit(job)
            if plan is not None or not jobs:
                return plan, generation

    def _plan_locked(self, now: float | None = None) -> Plan | None:
        if self._state.lost is not None:
            return None
        began = time.perf_counter()
        now = self._clock() if now is None else now
        plan = self._planner.plan(now, self.config)
        if plan is None:
            return None
        start = PlanStart(now, self.metrics.idle_since(now), time.perf_counter() - began)
        return replace(plan, start=start)

    def cancel_sample(self, request_id: str) -> bool:
        """The client went away: a waiting sample leaves the queue (its future fails), a
        running one is dropped by the next sample step (its KV pages freed). Returns whether
        the request was found here (still waiting or running)."""
        with self._state.lock:
            taken = self._state.samples.take_waiting(lambda it: it.request_id == request_id)
            for item in taken:
                self._state.op_done(item.tenant)
            running = self._state.samples.is_running(request_id)
            if running:
                self._planner.cancel(request_id)
                self._state.notify_locked()
        self._done.fail_unstarted((it, cancelled_error(), sample_op(it).base_model)
                                  for it in taken)
        return bool(taken) or running

    def complete(self, plan: Plan, outcome: PlanOutcome) -> None:
        """Apply the outcome of ``plan``: effects, futures, queue advance, usage, metrics. If
        the worker was lost during it, nothing is applied: `evacuate` hands it over."""
        if outcome.lost is not None:
            with self._state.lock:
                self._state.lost, self._lost_plan = outcome.lost, plan
                self._state.notify_locked()
            return
        began = time.perf_counter()
        self.futures.add_progress(outcome.progress)
        items, usage = self._done.complete(plan, outcome)
        with self._state.lock:
            self._choice.plan_done(plan, outcome.engine_s, bool(outcome.outcomes))
            num_running = self._state.samples.num_running()
        if isinstance(plan, InstallPlan):
            self._done.installed_sampler_adapters(plan, outcome)
        self.metrics.plan_done(plan, outcome, items, usage, num_running,
                               time.perf_counter() - began)

    # ---- a lost worker (the lane's clock loop has stopped) --------------------------------

    def mark_lost(self, error: WorkerLostError) -> None:
        """The worker was found dead outside a plan (its idle liveness check): the lane's
        clock loop stops and hands everything over, as after a plan that lost it."""
        with self._state.lock:
            if self._state.lost is None:
                self._state.lost = error
            self._state.notify_locked()

    def evacuate(self) -> Evacuation:
        """Take every op this scheduler holds and its live runs (`evacuation.evacuate`);
        nothing is left to run here."""
        with self._state.lock:
            return evacuate(self._state, self._lost_plan)

    def fail_evacuated(self, items: Sequence[tuple[WorkItem, str | None]],
                       error_for: Callable[[WorkItem], LoraplexError]) -> None:
        """Fail what `evacuate` took, each op with its own error."""
        self._done.fail_unstarted((item, error_for(item), base_model) for item, base_model in items)

    def adopt(self, run: EvacuatedRun, restore: LoadWork, path: TinkerPath) -> None:
        """Take over a lost worker's run: its adapter is restored from ``restore`` (an op of
        the run's own, just before the client's next seq_id) before its next op runs."""
        item = WorkItem(f"req-restore-{uuid.uuid4().hex}", run.tenant, "LoadWeights",
                        LoadOp(restore, path), model_id=run.model_id, seq_id=run.next_seq - 1,
                        enqueued_at=self._clock())
        with self._state.lock:
            queue = self._state.queues[run.model_id] = ModelQueue(
                run.model_id, run.tenant, first_seq=run.next_seq - 1,
                base_model=run.base_model, now=item.enqueued_at,
                max_ahead=self.config.max_seq_ahead)
            queue.offer(item, Admitted(item.request_id))
            self._state.inflight[item.tenant] += 1
            self.futures.create(item.request_id, item.tenant, item.kind)
            self._state.notify_locked()
