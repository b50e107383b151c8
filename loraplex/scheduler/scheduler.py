"""The scheduler: a state machine over per-model queues and the sampling queue.

    submit(item)          any thread: dedupe, admission, queue, create the future
    plan(now) -> Plan     clock thread: pick the next engine call and mark its items started
    complete(plan, out)   clock thread: apply effects, resolve futures, advance queues

Ordering (with `ModelQueue`): ops of one model start in seq_id order and only after every
earlier op of the model finished; a save / load / create / snapshot runs alone, after all
earlier ops of its model; sampling requests have no order.

Policy (`_plan_locked`, the one place it lives):
1. Saves and loads at a model's head start on an IO thread (`io_workers`): the file work
   (write, encrypt, commit; read) never runs on the clock thread, so other models' cycles go
   on meanwhile; the model stays busy until it is done, so its order is kept. A checkpoint
   read ends in an `InstallPlan` (putting the tensors into the engine is clock-thread work).
   Samples of a checkpoint whose adapter is not resident get it read the same way and wait
   (without holding back their tenant's other samples) until it is installed.
2. Then releases of unused adapters, installs, and ops stuck behind a seq_id missing for longer
   than ``seq_gap_timeout_s`` (they fail with a user error; the missing id is skipped).
3. Training and sampling share the engine by engine time (`WorkChoice`): while both have
   work, sampling gets ``sample_share`` of it and training the rest; alone, either gets all;
   after a sampling step finished requests, training waits briefly for their clients' next.
4. Training work is a clock cycle or one control op; they alternate when both are ready.
   A **clock cycle** is one engine ``forward_backward`` call packing the ready forward /
   forward_backward ops of many models — for each model its *run*: several consecutive ops
   (a call's chunks) when no optim_step / save / load sits between them — chosen by deficit
   round-robin over tenants up to ``token_budget`` datum tokens, then one ``optim_step`` call
   for every model whose run ended in an optim_step (or whose head is one). So a
   forward_backward and the optim_step submitted right after it complete in the same cycle:
   a pipelined client needs one cycle per step. ``timeslice`` packs one model per cycle.
5. A sampling step admits waiting requests by deficit round-robin over tenants while their KV
   reservations fit ``sample_kv_budget_tokens`` (`SampleQueue`), then decodes every running
   sequence for up to ``decode_steps_per_cycle`` steps; requests join and leave between steps.
Admission: a tenant with ``max_inflight_per_tenant`` queued or running ops gets CapacityError
(HTTP 429) for new samples and for training ops that do not fill the gap its queue waits on.
Finishing an op (`Completion`) applies its effects, resolves its future and meters it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from loraplex.config import SchedulerConfig
from loraplex.domain.ids import TinkerPath
from loraplex.domain.ops import (
    Admitted,
    ControlPlan,
    CyclePlan,
    ExpirePlan,
    Install,
    InstallPlan,
    LoadOp,
    Plan,
    PlanStart,
    ReleasePlan,
    SamplePlan,
    WorkItem,
    does_file_work,
    new_run_of,
)
from loraplex.domain.sampling import cancelled_error
from loraplex.domain.work import LoadWork
from loraplex.errors import (
    CapacityError,
    LoraplexError,
    NotFoundError,
    WorkerLostError,
    user_error,
)
from loraplex.scheduler.completion import Completion, Finished
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.evacuation import EvacuatedRun, Evacuation, started_items
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.io_workers import IoWorkers, Job, ThreadedIo
from loraplex.scheduler.metrics import SchedulerMetrics
from loraplex.scheduler.model_queue import ModelQueue
from loraplex.scheduler.packer import CyclePacker
from loraplex.scheduler.residency import AdapterResidency, sample_op
from loraplex.scheduler.runner import PlanOutcome
from loraplex.scheduler.sample_queue import SampleQueue
from loraplex.scheduler.step_log import StepLog
from loraplex.scheduler.usage import UsageLog
from loraplex.scheduler.work_choice import WorkChoice

SAMPLE_DEDUPE_MEMORY = 65536


class Scheduler:
    """Schedules all work on one base model's executor.

    Args:
        executor: the engine (or a fake) for this base model.
        config: the scheduler's config slice.
        futures: the server-wide future store.
        effects: store side effects of finished ops.
        clock: monotonic seconds (tests inject their own).
        io: where saves and checkpoint reads run (default: ``config.io_threads`` threads).
    """

    def __init__(self, executor: BatchExecutor, config: SchedulerConfig, futures: FutureStore,
                 effects: Effects, clock: Callable[[], float] = time.monotonic,
                 io: IoWorkers | None = None) -> None:
        self.executor = executor
        self.config = config
        self.futures = futures
        self.usage = UsageLog()
        self.steps = StepLog()
        self.metrics = SchedulerMetrics(config.cycle_history, clock)
        self.io = io or ThreadedIo(config.io_threads)
        self._clock = clock
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._generation = 0  # bumped by every wake-up, so a waiter never misses one
        self._queues: dict[str, ModelQueue] = {}
        self._closing: set[str] = set()
        self._samples = SampleQueue(config.sample_kv_budget_tokens, config.quantum_tokens,
                                    executor.model_info().max_context,
                                    config.sample_prefill_tokens_per_step,
                                    config.sample_max_tenant_share,
                                    config.latency_fair_window_s)
        self._sample_seen: OrderedDict[tuple[str, int], Admitted] = OrderedDict()
        self._inflight: Counter[str] = Counter()
        self._packer = CyclePacker(config.quantum_tokens)
        self._choice = WorkChoice(config)
        self._last_training = "control"
        self._installs: list[Install] = []
        self._cancelled: set[str] = set()  # running samples to drop at the next sample step
        self._jobs: list[Job] = []  # IO jobs to submit once the lock is released
        self.lost: WorkerLostError | None = None  # the worker died: hand everything over
        self._lost_plan: Plan | None = None
        self._lost_io: list[WorkItem] = []  # saves / reads the worker died under
        self._evacuated = False
        self.residency = AdapterResidency(config.max_sampler_snapshots_per_model,
                                          config.max_checkpoint_samplers)
        self._done = Completion(self, effects)

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
            if self.lost is not None:  # HTTP 500: the SDK resubmits, to a live lane
                raise WorkerLostError(f"{self.lost.message}; resubmit")
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
            self._inflight[item.tenant] += 1
            self.futures.create(item.request_id, item.tenant, item.kind)
            self.notify_locked()
        return admitted

    def _offer_training(self, item: WorkItem, admitted: Admitted) -> Admitted | None:
        model_id, seq = item.model_id, item.seq_id
        assert model_id is not None and seq is not None
        queue = self._queues.get(model_id)
        new_run = new_run_of(item.op)
        if queue is None and new_run is not None:
            queue = self._queues[model_id] = ModelQueue(
                model_id, item.tenant, base_model=new_run.base_model, now=item.enqueued_at,
                max_ahead=self.config.max_seq_ahead)
        if queue is None or queue.tenant != item.tenant or model_id in self._closing:
            raise NotFoundError(f"model_id: no live training run {model_id!r}", field="model_id")
        previous = queue.admitted_for(seq)
        if previous is not None:
            return previous
        if self._over_limit(item.tenant) and seq != queue.next_seq:
            # the op a queue waits on is never refused: its chunks arrive out of order
            raise CapacityError(f"tenant has {self._inflight[item.tenant]} ops in flight; retry")
        self.futures.check_room(item.tenant)
        queue.offer(item, admitted)
        return None

    def _offer_sample(self, item: WorkItem,
                      admitted: Admitted) -> tuple[WorkItem, Admitted | None]:
        key = item.sampler_key
        if key is not None and key in self._sample_seen:
            return item, self._sample_seen[key]
        self._check_room(item.tenant)
        item = replace(item, op=self.residency.bind(sample_op(item)))
        self._samples.add(item)
        if key is not None:
            self._sample_seen[key] = admitted
            while len(self._sample_seen) > SAMPLE_DEDUPE_MEMORY:
                self._sample_seen.popitem(last=False)
        return item, None

    def _over_limit(self, tenant: str) -> bool:
        return self._inflight[tenant] >= self.config.max_inflight_per_tenant

    def _check_room(self, tenant: str) -> None:
        """Raises CapacityError (HTTP 429, the SDK backs off) for a tenant at its in-flight
        limit or holding too many unfetched results."""
        if self._over_limit(tenant):
            raise CapacityError(f"tenant has {self._inflight[tenant]} ops in flight; retry")
        self.futures.check_room(tenant)

    def num_models(self, tenant: str) -> int:
        """The tenant's live training runs on this scheduler."""
        with self._lock:
            return sum(q.tenant == tenant and m not in self._closing
                       for m, q in self._queues.items())

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
                self.notify_locked()

    def drop_sampler_adapters(self, prefix: str) -> None:
        """Forget the sampler adapters whose id starts with ``prefix`` (a deleted checkpoint);
        each leaves the engine once no running sample uses it."""
        with self._lock:
            self.residency.drop_prefix(prefix)
            self.notify_locked()

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
        """The next plan, sleeping up to ``timeout`` for a wake-up when there is none."""
        plan, generation = self._plan_and_submit(None)
        if plan is not None:
            return plan
        with self._lock:
            if self._generation == generation:
                hold_s = self._choice.hold_s
                self._wakeup.wait(min(timeout, hold_s) if hold_s else timeout)
        return self.plan()

    def wake(self) -> None:
        with self._lock:
            self.notify_locked()

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
            with self._lock:
                plan = self._plan_locked(now)
                jobs, self._jobs = self._jobs, []
                generation = self._generation
            for job in jobs:
                self.io.submit(job)
            if plan is not None or not jobs:
                return plan, generation

    def _plan_locked(self, now: float | None = None) -> Plan | None:
        if self.lost is not None:
            return None
        began = time.perf_counter()
        now = self._clock() if now is None else now
        self._start_io(now)
        plan: Plan | None = (self._release_plan() or self._install_plan()
                             or self._expire_plan(now))
        if plan is None:
            work_class = self._choice.pick(self._has_training(), self._sample_ready())
            if work_class == "train":
                plan = self._build_training(now)
            elif work_class == "sample":
                plan = self._build_sample()
        if plan is None:
            return None
        start = PlanStart(now, self.metrics.idle_since(now), time.perf_counter() - began)
        return replace(plan, start=start)

    def _start_io(self, now: float) -> None:
        """Start the saves and loads at models' heads, and the checkpoint reads that waiting
        samples need, on IO threads (policy 1)."""
        for queue in self._queues.values():
            head = queue.head()
            if head is not None and does_file_work(head.op):
                queue.start([head], now)
                self._jobs.append(partial(self._done.run_io_op, head, now))
        for item in self._samples.waiting_items():
            op = sample_op(item)
            work = op.work
            if self.residency.needs_read(op):
                assert work.adapter_id is not None and work.adapter_dir is not None
                self.residency.start_reading(work.adapter_id)
                self._jobs.append(partial(self._done.read_sampler_adapter, work.adapter_id,
                                          work.adapter_dir))

    def _is_ready(self, item: WorkItem) -> bool:
        return self.residency.is_ready(sample_op(item))

    def _sample_ready(self) -> bool:
        return self._samples.num_running() > 0 or any(
            self._is_ready(it) for it in self._samples.waiting_items())

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

    def _install_plan(self) -> InstallPlan | None:
        installs, self._installs = self._installs, []
        return InstallPlan(tuple(installs)) if installs else None

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
            self.queue_of(item).start([item], now)
            return ControlPlan(item)
        self._last_training = "cycle"
        return self._build_cycle(runs, now)

    def _build_cycle(self, runs: dict[str, list[WorkItem]], now: float) -> CyclePlan:
        packed = self._packer.pack(runs, self.config, now)
        for model_id, items in packed.started.items():
            self._queues[model_id].start(items, now)
        return CyclePlan(packed.batch, packed.optim)

    def _build_sample(self) -> SamplePlan:
        admit = self._samples.admit(self._is_ready, self._clock())
        for item in admit:
            self.residency.admit(sample_op(item))
        cancel, self._cancelled = tuple(sorted(self._cancelled)), set()
        steps = self.config.decode_steps_per_cycle
        if self._samples.any_streaming():
            steps = min(steps, self.config.stream_decode_steps)
        return SamplePlan(tuple(admit), steps, cancel=cancel)

    def cancel_sample(self, request_id: str) -> bool:
        """The client went away: a waiting sample leaves the queue (its future fails), a
        running one is dropped by the next sample step (its KV pages freed). Returns whether
        the request was found here (still waiting or running)."""
        with self._lock:
            taken = self._samples.take_waiting(lambda it: it.request_id == request_id)
            for item in taken:
                self.op_done(item.tenant)
            running = self._samples.is_running(request_id)
            if running:
                self._cancelled.add(request_id)
                self.notify_locked()
        self.usage.add([self._done.deliver(Finished(it, cancelled_error(), 0.0,
                                                    sample_op(it).base_model)) for it in taken])
        return bool(taken) or running

    def complete(self, plan: Plan, outcome: PlanOutcome) -> None:
        """Apply the outcome of ``plan``: effects, futures, queue advance, usage, metrics. If
        the worker was lost during it, nothing is applied: `evacuate` hands it over."""
        if outcome.lost is not None:
            with self._lock:
                self.lost, self._lost_plan = outcome.lost, plan
                self.notify_locked()
            return
        began = time.perf_counter()
        self.futures.add_progress(outcome.progress)
        finished = self._done.finish_plan(plan, outcome)
        usage = [self._done.deliver(f) for f in finished]
        self.usage.add(usage)
        with self._lock:
            self._choice.plan_done(plan, outcome.engine_s, bool(outcome.outcomes))
            num_running = self._samples.num_running()
        if isinstance(plan, InstallPlan):
            self._done.installed_sampler_adapters(plan, outcome)
        self.metrics.plan_done(plan, outcome, [f.item for f in finished], usage, num_running,
                               time.perf_counter() - began)

    # ---- a lost worker (the lane's clock loop has stopped) --------------------------------

    def mark_lost(self, error: WorkerLostError) -> None:
        """The worker was found dead outside a plan (its idle liveness check): the lane's
        clock loop stops and hands everything over, as after a plan that lost it."""
        with self._lock:
            if self.lost is None:
                self.lost = error
            self.notify_locked()

    def io_lost(self, item: WorkItem, error: WorkerLostError) -> bool:
        """A save or read found the worker dead: the lane stops, and the op is failed with the
        others by the evacuation (True), unless that already ran (False: fail it yourself)."""
        with self._lock:
            if self._evacuated:
                return False
            self._lost_io.append(item)
            if self.lost is None:
                self.lost = error
            self.notify_locked()
            return True

    def evacuate(self) -> Evacuation:
        """Take every op this scheduler holds (the lost plan's, saves and reads the worker died
        under, loads read but not installed, waiting training ops, waiting and running samples)
        and its live runs; nothing is left to run here."""
        with self._lock:
            self._evacuated = True
            read = [i.item for i in self._installs if i.item is not None]  # loads read
            self._installs = []
            items = [(it, self._queues[it.model_id].base_model if it.model_id else None)
                     for it in (*started_items(self._lost_plan), *self._lost_io, *read)]
            runs = []
            for model_id, queue in self._queues.items():
                waiting = queue.take_waiting()
                items += [(it, queue.base_model) for it in waiting]
                last = max((it.seq_id or 0 for it in waiting), default=queue.next_seq - 1)
                if model_id not in self._closing:
                    runs.append(EvacuatedRun(model_id, queue.tenant, queue.base_model,
                                             max(last + 1, queue.next_seq)))
                self._closing.add(model_id)
            items += [(it, sample_op(it).base_model) for it in self._samples.take_all()]
            for item, _ in items:
                self.op_done(item.tenant)
            return Evacuation(tuple(items), tuple(runs))

    def fail_evacuated(self, items: Sequence[tuple[WorkItem, str | None]],
                       error_for: Callable[[WorkItem], LoraplexError]) -> None:
        """Fail what `evacuate` took, each op with its own error."""
        self.usage.add([self._done.deliver(Finished(item, error_for(item), 0.0, base_model))
                        for item, base_model in items])

    def adopt(self, run: EvacuatedRun, restore: LoadWork, path: TinkerPath) -> None:
        """Take over a lost worker's run: its adapter is restored from ``restore`` (an op of
        the run's own, just before the client's next seq_id) before its next op runs."""
        item = WorkItem(f"req-restore-{uuid.uuid4().hex}", run.tenant, "LoadWeights",
                        LoadOp(restore, path), model_id=run.model_id, seq_id=run.next_seq - 1,
                        enqueued_at=self._clock())
        with self._lock:
            queue = self._queues[run.model_id] = ModelQueue(
                run.model_id, run.tenant, first_seq=run.next_seq - 1,
                base_model=run.base_model, now=item.enqueued_at,
                max_ahead=self.config.max_seq_ahead)
            queue.offer(item, Admitted(item.request_id))
            self._inflight[item.tenant] += 1
            self.futures.create(item.request_id, item.tenant, item.kind)
            self.notify_locked()

    # ---- state shared with `Completion` (always under the lock) ------------------------

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def now(self) -> float:
        """The scheduler's clock (monotonic seconds; what ``enqueued_at`` is measured on)."""
        return self._clock()

    def queue_of(self, item: WorkItem) -> ModelQueue:
        assert item.model_id is not None
        return self._queues[item.model_id]

    @property
    def samples(self) -> SampleQueue:
        return self._samples

    def add_install(self, install: Install) -> bool:
        """Queue a read checkpoint for installing; False when the worker was lost and
        everything here was evacuated already (the caller fails its op)."""
        if self._evacuated:
            return False
        self._installs.append(install)
        self.notify_locked()
        return True

    def done_reading(self, adapter_id: str) -> None:
        self.residency.done_reading(adapter_id)
        self.notify_locked()

    def op_done(self, tenant: str) -> None:
        self._inflight[tenant] -= 1
        if self._inflight[tenant] <= 0:
            del self._inflight[tenant]

    def notify_locked(self) -> None:
        self._generation += 1
        self._wakeup.notify_all()

