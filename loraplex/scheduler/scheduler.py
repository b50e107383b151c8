"""The scheduler: a state machine over per-model queues and the sampling queue.

    submit(item)          any thread: dedupe, admission, queue, create the future
    plan(now) -> Plan     clock thread: pick the next engine call and mark its items started
    complete(plan, out)   clock thread: apply effects, resolve futures, advance queues

Ordering rules enforced here (with `ModelQueue`): ops of one model run one at a time in seq_id
order; a forward_backward therefore finishes before the optim_step after it; a save or load
runs after every earlier op of its model. Sampling requests have no order and are batched
continuously.

Policy (one place, `plan`): phases rotate train → optim → control → sample, each step taking the
first phase with work, so training and sampling both keep moving and an optim_step runs in the
step right after the forward_backward before it. A train step packs the ready
forward/forward_backward ops of many models (one per model) chosen by deficit round-robin over
tenants up to ``token_budget`` tokens (``timeslice``: one model per step). Admission: a tenant
with ``max_inflight_per_tenant`` queued or running ops gets CapacityError (HTTP 429) for new
samples and for training ops that do not fill the gap its queue waits on.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from loraplex.config import SchedulerConfig
from loraplex.errors import CapacityError, LoraplexError, NotFoundError, user_error
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.fairness import DeficitRoundRobin
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.model_queue import ModelQueue
from loraplex.scheduler.ops import (
    Admitted,
    CreateModelOp,
    ForwardBackwardOp,
    LoadOp,
    OptimStepOp,
    SampleOp,
    SnapshotOp,
    WorkItem,
)
from loraplex.scheduler.plan import (
    ControlPlan,
    OptimPlan,
    Plan,
    ReleasePlan,
    SamplePlan,
    TrainPlan,
)
from loraplex.scheduler.residency import AdapterResidency
from loraplex.scheduler.runner import PlanOutcome, server_bug, snapshot_adapter_id
from loraplex.scheduler.usage import CycleRecord, OpUsage, UsageLog

PHASES = ("train", "optim", "control", "sample")
SAMPLE_DEDUPE_MEMORY = 65536


class Scheduler:
    """Schedules all work on one base model's executor.

    Args:
        executor: the engine (or a fake) for this base model.
        config: the scheduler's config slice.
        futures: the server-wide future store.
        effects: store side effects of finished ops.
    """

    def __init__(self, executor: BatchExecutor, config: SchedulerConfig, futures: FutureStore,
                 effects: Effects, clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.config = config
        self.futures = futures
        self.effects = effects
        self.usage = UsageLog()
        self._clock = clock
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._queues: dict[str, ModelQueue] = {}
        self._closing: set[str] = set()
        self._waiting_samples: list[WorkItem] = []
        self._running_samples: dict[str, WorkItem] = {}
        self._sample_seen: OrderedDict[tuple[str, int], Admitted] = OrderedDict()
        self._inflight: Counter[str] = Counter()
        self._tokens_since_step: Counter[str] = Counter()
        self._fairness = DeficitRoundRobin(config.quantum_tokens)
        self.residency = AdapterResidency(config.max_sampler_snapshots_per_model,
                                          config.max_checkpoint_samplers)
        self._phase = 0

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
        with self._lock:
            if item.model_id is not None:
                duplicate = self._offer_training(item, admitted)
            else:
                item, duplicate = self._offer_sample(item, admitted)
            if duplicate is not None:
                return duplicate
            self._inflight[item.tenant] += 1
            self.futures.create(item.request_id, item.tenant, item.kind)
            self._wakeup.notify()
        return admitted

    def _offer_training(self, item: WorkItem, admitted: Admitted) -> Admitted | None:
        model_id, seq = item.model_id, item.seq_id
        assert model_id is not None and seq is not None
        queue = self._queues.get(model_id)
        creates = isinstance(item.op, CreateModelOp) or (
            isinstance(item.op, LoadOp) and item.op.new_run is not None)
        if queue is None and creates:
            queue = self._queues[model_id] = ModelQueue(model_id, item.tenant)
        if queue is None or queue.tenant != item.tenant or model_id in self._closing:
            raise NotFoundError(f"model_id: no live training run {model_id!r}", field="model_id")
        previous = queue.admitted_for(seq)
        if previous is not None:
            return previous
        if self._over_limit(item.tenant) and seq != queue.next_seq:
            raise CapacityError(f"tenant has {self._inflight[item.tenant]} ops in flight; retry")
        queue.offer(item, admitted)
        return None

    def _offer_sample(self, item: WorkItem,
                      admitted: Admitted) -> tuple[WorkItem, Admitted | None]:
        key = item.sampler_key
        if key is not None and key in self._sample_seen:
            return item, self._sample_seen[key]
        if self._over_limit(item.tenant):
            raise CapacityError(f"tenant has {self._inflight[item.tenant]} ops in flight; retry")
        item = self._bind_sampler_adapter(item)
        self._waiting_samples.append(item)
        if key is not None:
            self._sample_seen[key] = admitted
            while len(self._sample_seen) > SAMPLE_DEDUPE_MEMORY:
                self._sample_seen.popitem(last=False)
        return item, None

    def _bind_sampler_adapter(self, item: WorkItem) -> WorkItem:
        op = item.op
        assert isinstance(op, SampleOp)
        adapter_id = op.work.adapter_id
        if op.source == "inflight":
            assert op.model_id is not None
            adapter_id = self.residency.current_inflight(op.model_id)
        if op.source in ("snapshot", "inflight") and (
                adapter_id is None or not self.residency.is_live(adapter_id)):
            raise user_error("sampling_session_id", "the weights snapshot behind this sampling "
                             "session is gone (evicted by newer snapshots, its training session "
                             "ended, or the server restarted); save weights for sampler again")
        if adapter_id == op.work.adapter_id:
            return item
        return replace(item, op=replace(op, work=replace(op.work, adapter_id=adapter_id)))

    def _over_limit(self, tenant: str) -> bool:
        return self._inflight[tenant] >= self.config.max_inflight_per_tenant

    def previous_admission(self, model_id: str, seq_id: int) -> Admitted | None:
        """The admission of an earlier submit of ``(model_id, seq_id)``, if remembered."""
        with self._lock:
            queue = self._queues.get(model_id)
            return None if queue is None else queue.admitted_for(seq_id)

    def has_model(self, model_id: str) -> bool:
        with self._lock:
            return model_id in self._queues and model_id not in self._closing

    def release_model(self, model_id: str) -> None:
        """Drop a training run's adapters once its queued ops are done (session finished)."""
        with self._lock:
            if model_id in self._queues:
                self._closing.add(model_id)
                self._wakeup.notify()

    def queue_state(self, tenant: str) -> str:
        with self._lock:
            return "paused_rate_limit" if self._over_limit(tenant) else "active"

    # ---- the state machine (clock thread) -------------------------------------------------

    def wait_for_plan(self, timeout: float) -> Plan | None:
        with self._lock:
            plan = self._plan_locked()
            if plan is None:
                self._wakeup.wait(timeout)
                plan = self._plan_locked()
            return plan

    def wake(self) -> None:
        with self._lock:
            self._wakeup.notify_all()

    def plan(self, now: float | None = None) -> Plan | None:
        """The next engine call, its items marked started; None when there is nothing to do.

        Args:
            now: the caller's clock; unused by today's policy, which only orders and packs
                (time-based policies, e.g. cycle deadlines, read it).
        """
        with self._lock:
            return self._plan_locked()

    def _plan_locked(self) -> Plan | None:
        released = self._releasable()
        if released:
            return ReleasePlan(tuple(released))
        for i in range(len(PHASES)):
            phase = PHASES[(self._phase + i) % len(PHASES)]
            plan = self._build(phase)
            if plan is not None:
                self._phase = (PHASES.index(phase) + 1) % len(PHASES)
                return plan
        return None

    def _build(self, phase: str) -> Plan | None:
        if phase == "sample":
            return self._build_sample()
        heads = [h for q in self._queues.values() if (h := q.head()) is not None]
        if phase == "train":
            ready = [h for h in heads if isinstance(h.op, ForwardBackwardOp)]
            if not ready:
                return None
            budget = 0 if self.config.timeslice else self.config.token_budget
            return TrainPlan(tuple(self._start(self._fairness.select(ready, budget))))
        if phase == "optim":
            ready = [h for h in heads if isinstance(h.op, OptimStepOp)]
            return OptimPlan(tuple(self._start(ready[:1] if self.config.timeslice else ready))
                             ) if ready else None
        control = [h for h in heads if not isinstance(h.op, ForwardBackwardOp | OptimStepOp)]
        if not control:
            return None
        return ControlPlan(self._start([min(control, key=lambda h: h.enqueued_at)])[0])

    def _build_sample(self) -> SamplePlan | None:
        if not self._waiting_samples and not self._running_samples:
            return None
        admit, self._waiting_samples = self._waiting_samples, []
        for item in admit:
            op = item.op
            assert isinstance(op, SampleOp)
            if op.work.adapter_id is not None:
                if op.source == "checkpoint":
                    self.residency.use_checkpoint(op.work.adapter_id)
                self.residency.acquire(op.work.adapter_id)
            self._running_samples[item.request_id] = item
        return SamplePlan(tuple(admit), self.config.decode_steps_per_cycle)

    def _start(self, items: list[WorkItem]) -> list[WorkItem]:
        for item in items:
            assert item.model_id is not None
            self._queues[item.model_id].start_head()
        return items

    def _releasable(self) -> list[str]:
        released = self.residency.take_releasable()
        for model_id in sorted(self._closing):
            queue = self._queues[model_id]
            if not queue.is_busy and queue.num_waiting() == 0:
                del self._queues[model_id]
                self._closing.discard(model_id)
                self.residency.drop_model(model_id)
                released.append(model_id)
                released.extend(self.residency.take_releasable())
        return released

    def complete(self, plan: Plan, outcome: PlanOutcome) -> None:
        """Apply the outcome of ``plan``: effects, futures, queue advance, usage."""
        finished = self._finish_items(plan, outcome)
        total_tokens = sum(item.num_tokens for item, _ in finished)
        usage = []
        for item, result in finished:
            share = (item.num_tokens / total_tokens if total_tokens
                     else 1.0 / len(finished))
            usage.append(self._deliver(item, result, outcome.engine_s * share))
        self.usage.add(_cycle_record(plan, outcome, finished), usage)

    def _finish_items(self, plan: Plan, outcome: PlanOutcome) -> list[tuple[WorkItem, Any]]:
        with self._lock:
            if isinstance(plan, SamplePlan):
                items = self._finish_samples(outcome)
            elif isinstance(plan, ControlPlan):
                items = [plan.item]
            elif isinstance(plan, ReleasePlan):
                items = []
            else:
                items = list(plan.items)
            finished = []
            for item in items:
                result = outcome.bug or outcome.outcomes.get(item.request_id)
                if result is None and not isinstance(plan, ControlPlan):
                    result = server_bug(RuntimeError("executor dropped a work item"), "complete")
                if item.model_id is not None:
                    self._queues[item.model_id].finish_head()
                self._inflight[item.tenant] -= 1
                if self._inflight[item.tenant] <= 0:
                    del self._inflight[item.tenant]
                finished.append((item, result))
            return finished

    def _finish_samples(self, outcome: PlanOutcome) -> list[WorkItem]:
        ids = list(self._running_samples) if outcome.bug else [
            rid for rid in outcome.outcomes if rid in self._running_samples]
        items = [self._running_samples.pop(rid) for rid in ids]
        for item in items:
            assert isinstance(item.op, SampleOp)
            if item.op.work.adapter_id is not None:
                self.residency.release(item.op.work.adapter_id)
        return items

    def _deliver(self, item: WorkItem, result: Any, engine_s: float) -> OpUsage:
        usage = _op_usage(item, result, engine_s)
        if isinstance(result, LoraplexError):
            self._fail(item, result)
            return usage
        try:
            value = self.effects.succeeded(
                item, result, engine_adapter=self._after_success(item),
                trained_tokens=self._step_tokens(item))
        except LoraplexError as exc:
            self._fail(item, exc)
        except Exception as exc:  # a store failure must not kill the clock loop
            self._fail(item, server_bug(exc, f"effects of {item.kind}"))
        else:
            self.futures.resolve(item.request_id, value)
        return usage

    def _after_success(self, item: WorkItem) -> str | None:
        """Scheduler-side bookkeeping of a success; returns a snapshot's engine adapter id."""
        op = item.op
        if isinstance(op, ForwardBackwardOp) and not op.work.forward_only:
            with self._lock:
                self._tokens_since_step[op.work.adapter_id] += op.work.num_tokens
        if not isinstance(op, SnapshotOp):
            return None
        adapter_id = snapshot_adapter_id(item)
        with self._lock:
            self.residency.add_snapshot(op.model_id, adapter_id, inflight=op.kind == "inflight")
        return adapter_id

    def _step_tokens(self, item: WorkItem) -> int:
        if not isinstance(item.op, OptimStepOp):
            return 0
        with self._lock:
            return self._tokens_since_step.pop(item.op.work.adapter_id, 0)

    def _fail(self, item: WorkItem, error: LoraplexError) -> None:
        op = item.op
        if item.model_id is not None and (isinstance(op, CreateModelOp) or (
                isinstance(op, LoadOp) and op.new_run is not None)):
            self.release_model(item.model_id)  # the run never came to life: drop its queue
        try:
            self.effects.failed(item, error)
        finally:
            self.futures.fail(item.request_id, error)

    def num_queued(self) -> int:
        with self._lock:
            return (sum(q.num_waiting() for q in self._queues.values())
                    + len(self._waiting_samples) + len(self._running_samples))


def _op_usage(item: WorkItem, result: Any, engine_s: float) -> OpUsage:
    op = item.op
    tokens = item.num_tokens
    usage = OpUsage(item.request_id, item.tenant, item.model_id, item.kind, engine_s)
    if isinstance(op, ForwardBackwardOp):
        trained = 0 if op.work.forward_only else tokens
        return replace(usage, trained_tokens=trained, forward_tokens=tokens - trained)
    if isinstance(op, SampleOp) and not isinstance(result, LoraplexError) and result is not None:
        sampled = sum(len(s.tokens) for s in result.sequences)
        return replace(usage, prefill_tokens=tokens, sampled_tokens=sampled,
                       cache_hit_tokens=result.prompt_cache_hit_tokens)
    return usage


def _cycle_record(plan: Plan, outcome: PlanOutcome,
                  finished: list[tuple[WorkItem, Any]]) -> CycleRecord:
    items = [it for it, _ in finished]
    if isinstance(plan, SamplePlan):
        items = list({it.request_id: it for it in (*plan.admit, *items)}.values())
    kind = type(plan).__name__.removesuffix("Plan").lower()
    return CycleRecord(kind, time.monotonic() - outcome.engine_s, outcome.engine_s,
                       tuple(sorted({it.tenant for it in items})), len(items),
                       sum(it.num_tokens for it in items))
