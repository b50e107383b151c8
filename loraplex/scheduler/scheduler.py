"""The scheduler: a state machine over per-model queues and the sampling queue.

    submit(item)          any thread: dedupe, admission, queue, create the future
    plan(now) -> Plan     clock thread: pick the next engine call and mark its items started
    complete(plan, out)   clock thread: apply effects, resolve futures, advance queues

Ordering (with `ModelQueue`): ops of one model start in seq_id order and only after every
earlier op of the model finished; a save / load / create / snapshot runs alone, after all
earlier ops of its model; sampling requests have no order.

Policy (`_plan_locked`, the one place it lives):
1. Releases of unused adapters first, then ops stuck behind a seq_id missing for longer than
   ``seq_gap_timeout_s`` (they fail with a user error; the missing id is skipped).
2. Training and sampling share the engine by engine time (`EngineShare`): while both have
   work, sampling gets ``sample_share`` of it and training the rest; alone, either gets all.
3. Training work is a clock cycle or one control op; they alternate when both are ready.
   A **clock cycle** is one engine ``forward_backward`` call packing the ready forward /
   forward_backward ops of many models — for each model its *run*: several consecutive ops
   (a call's chunks) when no optim_step / save / load sits between them — chosen by deficit
   round-robin over tenants up to ``token_budget`` datum tokens, then one ``optim_step`` call
   for every model whose run ended in an optim_step (or whose head is one). So a
   forward_backward and the optim_step submitted right after it complete in the same cycle:
   a pipelined client needs one cycle per step. ``timeslice`` packs one model per cycle.
4. A sampling step admits waiting requests by deficit round-robin over tenants while their KV
   reservations fit ``sample_kv_budget_tokens`` (`SampleQueue`), then decodes every running
   sequence for up to ``decode_steps_per_cycle`` steps; requests join and leave between steps.
Admission: a tenant with ``max_inflight_per_tenant`` queued or running ops gets CapacityError
(HTTP 429) for new samples and for training ops that do not fill the gap its queue waits on.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from loraplex.config import SchedulerConfig
from loraplex.errors import CapacityError, LoraplexError, NotFoundError, user_error
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.engine_share import EngineShare, WorkClass
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.metrics import SchedulerMetrics
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
from loraplex.scheduler.packer import CyclePacker
from loraplex.scheduler.plan import (
    ControlPlan,
    CyclePlan,
    ExpirePlan,
    Plan,
    ReleasePlan,
    SamplePlan,
)
from loraplex.scheduler.residency import AdapterResidency
from loraplex.scheduler.runner import PlanOutcome, server_bug, snapshot_adapter_id
from loraplex.scheduler.sample_queue import SampleQueue
from loraplex.scheduler.usage import OpUsage, UsageLog, engine_shares, op_usage

SAMPLE_DEDUPE_MEMORY = 65536


class Scheduler:
    """Schedules all work on one base model's executor.

    Args:
        executor: the engine (or a fake) for this base model.
        config: the scheduler's config slice.
        futures: the server-wide future store.
        effects: store side effects of finished ops.
        clock: monotonic seconds (tests inject their own).
    """

    def __init__(self, executor: BatchExecutor, config: SchedulerConfig, futures: FutureStore,
                 effects: Effects, clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.config = config
        self.futures = futures
        self.effects = effects
        self.usage = UsageLog()
        self.metrics = SchedulerMetrics(config.cycle_history, clock)
        self._clock = clock
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._queues: dict[str, ModelQueue] = {}
        self._closing: set[str] = set()
        self._samples = SampleQueue(config.sample_kv_budget_tokens, config.quantum_tokens,
                                    executor.model_info().max_context)
        self._sample_seen: OrderedDict[tuple[str, int], Admitted] = OrderedDict()
        self._inflight: Counter[str] = Counter()
        self._tokens_since_step: Counter[str] = Counter()
        self._packer = CyclePacker(config.quantum_tokens)
        self._share = EngineShare(config.sample_share)
        self._last_training = "control"
        self._plan_class: dict[int, WorkClass] = {}
        self.residency = AdapterResidency(config.max_sampler_snapshots_per_model,
                                          config.max_checkpoint_samplers)

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
            try:
                if item.model_id is not None:
                    duplicate = self._offer_training(item, admitted)
                else:
                    item, duplicate = self._offer_sample(item, admitted)
            except CapacityError:
                self.metrics.rejected(item.tenant, item.kind)
                raise
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
        op = item.op
        new_run = op.run if isinstance(op, CreateModelOp) else (
            op.new_run if isinstance(op, LoadOp) else None)
        if queue is None and new_run is not None:
            queue = self._queues[model_id] = ModelQueue(
                model_id, item.tenant, base_model=new_run.base_model, now=item.enqueued_at)
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
        assert isinstance(item.op, SampleOp)
        item = replace(item, op=self.residency.bind(item.op))
        self._samples.add(item)
        if key is not None:
            self._sample_seen[key] = admitted
            while len(self._sample_seen) > SAMPLE_DEDUPE_MEMORY:
                self._sample_seen.popitem(last=False)
        return item, None

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
        """The SDK's queue state for the tenant's pending futures (tinker-api.md §4.2)."""
        with self._lock:
            if self._over_limit(tenant):
                return "paused_rate_limit"
            return "paused_capacity" if self._samples.num_waiting(tenant) else "active"

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per tenant: training ops waiting, samples waiting / running, ops in flight."""
        with self._lock:
            out: defaultdict[str, dict[str, int]] = defaultdict(
                lambda: {"train_waiting": 0, "sample_waiting": 0, "sample_running": 0,
                         "inflight": 0})
            for queue in self._queues.values():
                out[queue.tenant]["train_waiting"] += queue.num_waiting()
            for tenant, n in self._samples.waiting_by_tenant().items():
                out[tenant]["sample_waiting"] = n
            for tenant, n in self._samples.running_by_tenant().items():
                out[tenant]["sample_running"] = n
            for tenant, n in self._inflight.items():
                out[tenant]["inflight"] = n
            return dict(out)

    def num_queued(self) -> int:
        with self._lock:
            return (sum(q.num_waiting() for q in self._queues.values())
                    + self._samples.num_waiting() + self._samples.num_running())

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
            now: the caller's clock (defaults to the scheduler's; the gap timeout reads it).
        """
        with self._lock:
            return self._plan_locked(now)

    def _plan_locked(self, now: float | None = None) -> Plan | None:
        began = time.perf_counter()
        now = self._clock() if now is None else now
        work_class: WorkClass | None = None
        plan: Plan | None = self._release_plan() or self._expire_plan(now)
        if plan is None:
            work_class = self._share.pick(self._has_training(), self._samples.has_work())
            if work_class == "train":
                plan = self._build_training(now)
            elif work_class == "sample":
                plan = self._build_sample()
        if plan is None:
            return None
        if work_class is not None:
            self._plan_class[id(plan)] = work_class
        self.metrics.plan_started(plan, now, time.perf_counter() - began)
        return plan

    def _release_plan(self) -> ReleasePlan | None:
        released = self.residency.take_releasable()
        for model_id in sorted(self._closing):
            queue = self._queues[model_id]
            if not queue.is_busy and queue.num_waiting() == 0:
                del self._queues[model_id]
                self._closing.discard(model_id)
                self.residency.drop_model(model_id)
                released.append(model_id)
                released.extend(self.residency.take_releasable())
        return ReleasePlan(tuple(released)) if released else None

    def _expire_plan(self, now: float) -> ExpirePlan | None:
        timeout = self.config.seq_gap_timeout_s
        if timeout is None:
            return None
        for queue in self._queues.values():
            since = queue.stuck_since()
            if since is not None and now - since > timeout:
                missing = queue.next_seq
                items = queue.give_up_gap(now)
                error = user_error("seq_id", f"seq_id {missing} of model {queue.model_id!r} "
                                   f"never arrived within {timeout:g} s, so the "
                                   f"{len(items)} ops queued after it were failed")
                return ExpirePlan(tuple(items), error)
        return None

    def _has_training(self) -> bool:
        return any(q.head() is not None for q in self._queues.values())

    def _build_training(self, now: float) -> Plan | None:
        runs = {m: r for m, q in self._queues.items() if (r := q.ready_run())}
        control = [h for q in self._queues.values()
                   if (h := q.head()) is not None and h.model_id not in runs]
        if control and (not runs or self._last_training == "cycle"):
            self._last_training = "control"
            item = min(control, key=lambda h: h.enqueued_at)
            self._start([item], now)
            return ControlPlan(item)
        self._last_training = "cycle"
        return self._build_cycle(runs, now)

    def _build_cycle(self, runs: dict[str, list[WorkItem]], now: float) -> CyclePlan:
        packed = self._packer.pack(runs, self.config)
        for model_id, items in packed.started.items():
            self._queues[model_id].start(items, now)
        return CyclePlan(packed.batch, packed.optim)

    def _build_sample(self) -> SamplePlan:
        admit = self._samples.admit()
        for item in admit:
            assert isinstance(item.op, SampleOp)
            self.residency.admit(item.op)
        return SamplePlan(tuple(admit), self.config.decode_steps_per_cycle)

    def _start(self, items: list[WorkItem], now: float) -> None:
        for item in items:
            assert item.model_id is not None
            self._queues[item.model_id].start([item], now)

    def complete(self, plan: Plan, outcome: PlanOutcome) -> None:
        """Apply the outcome of ``plan``: effects, futures, queue advance, usage, metrics."""
        began = time.perf_counter()
        finished = self._finish_items(plan, outcome)
        usage = [self._deliver(item, result, engine_s, base_model)
                 for item, result, engine_s, base_model in finished]
        self.usage.add(usage)
        with self._lock:
            work_class = self._plan_class.pop(id(plan), None)
            if work_class is not None:
                self._share.charge(work_class, outcome.engine_s)
            num_running = self._samples.num_running()
        self.metrics.plan_done(plan, outcome, [f[0] for f in finished], usage, num_running,
                               time.perf_counter() - began)

    def _finish_items(self, plan: Plan, outcome: PlanOutcome
                      ) -> list[tuple[WorkItem, Any, float, str | None]]:
        """Advance queues and counters; returns (item, outcome, engine seconds, base model)."""
        with self._lock:
            if isinstance(plan, SamplePlan):
                return self._finish_samples(outcome)
            if isinstance(plan, ReleasePlan):
                return []
            items = [plan.item] if isinstance(plan, ControlPlan) else list(plan.items)
            shares = engine_shares(plan, outcome)
            finished = []
            for item in items:
                result = outcome.bug or outcome.outcomes.get(item.request_id)
                if result is None and not isinstance(plan, ControlPlan):
                    result = server_bug(RuntimeError("executor dropped a work item"), "complete")
                assert item.model_id is not None
                queue = self._queues[item.model_id]
                queue.finish_one()
                self._done(item.tenant)
                finished.append((item, result, shares.get(item.request_id, 0.0),
                                 queue.base_model))
            return finished

    def _finish_samples(self, outcome: PlanOutcome
                        ) -> list[tuple[WorkItem, Any, float, str | None]]:
        self._samples.charge(outcome.engine_s)
        ids = self._samples.running_ids() if outcome.bug else list(outcome.outcomes)
        finished = []
        for rid in ids:
            done = self._samples.finish(rid)
            if done is None:
                continue
            item, engine_s = done
            assert isinstance(item.op, SampleOp)
            if item.op.work.adapter_id is not None:
                self.residency.release(item.op.work.adapter_id)
            self._done(item.tenant)
            finished.append((item, outcome.bug or outcome.outcomes[rid], engine_s,
                             item.op.base_model))
        return finished

    def _done(self, tenant: str) -> None:
        self._inflight[tenant] -= 1
        if self._inflight[tenant] <= 0:
            del self._inflight[tenant]

    def _deliver(self, item: WorkItem, result: Any, engine_s: float,
                 base_model: str | None) -> OpUsage:
        usage = op_usage(item, result, engine_s, base_model)
        if isinstance(result, LoraplexError):
            self._fail(item, result)
            return usage
        try:
            value = self.effects.succeeded(
                item, result, engine_adapter=self._after_success(item),
                trained_tokens=self._step_tokens(item))
        except LoraplexError as exc:
            self._fail(item, exc)
            return replace(usage, failed=True)
        except Exception as exc:  # a store failure must not kill the clock loop
            self._fail(item, server_bug(exc, f"effects of {item.kind}"))
            return replace(usage, failed=True)
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
