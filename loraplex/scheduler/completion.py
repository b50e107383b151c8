"""Finishing ops: the other half of the scheduler's state machine.

For a completed plan (clock thread) and for the file work of saves and checkpoint reads (IO
threads): advance the model queues and the sampling queue, apply each op's store effects,
resolve or fail its future, and meter it. Queue and residency state is the `SchedulerState`
`assembly` hands in, only touched under its lock; effects, futures and metering are
thread-safe and run outside it. A save's or load's model queue is freed only after its effects
are applied, so the next op of that model never starts before the checkpoint it wrote is
listed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import TypeVar, assert_never

from loraplex.domain.ops import (
    ControlPlan,
    CreateModelOp,
    CyclePlan,
    ExpirePlan,
    FailedOp,
    Install,
    InstallPlan,
    LoadOp,
    Plan,
    ReleasePlan,
    SampleOp,
    SamplePlan,
    SaveOp,
    SnapshotOp,
    WorkItem,
    new_run_of,
)
from loraplex.domain.results import AdapterReady, ItemOutcome
from loraplex.domain.usage import OpUsage
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SaveWork
from loraplex.errors import LoraplexError, WorkerLostError, server_bug
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.metrics import SchedulerMetrics
from loraplex.scheduler.residency import sample_op
from loraplex.scheduler.runner import PlanOutcome
from loraplex.scheduler.scheduler_state import SchedulerState
from loraplex.scheduler.step_log import StepLog, step_point
from loraplex.scheduler.usage import UsageLog, engine_shares, op_usage

T = TypeVar("T")


@dataclass(frozen=True)
class Finished:
    """An op whose engine (or IO) work is over, with what it ended with."""

    item: WorkItem
    result: ItemOutcome
    engine_s: float
    base_model: str | None


@dataclass(eq=False)
class Completion:
    """Finishes the ops of one scheduler (see the module docstring).

    Attributes:
        state: the scheduler's shared state (queues, samples, residency, in-flight counts).
        effects: store side effects of finished ops.
        executor: the engine, for the file work of saves and checkpoint reads.
        futures, usage, steps, metrics: where finished ops are resolved and recorded.
        clock: the scheduler's clock (what ``enqueued_at`` is measured on).
    """

    state: SchedulerState
    effects: Effects
    _: KW_ONLY
    executor: BatchExecutor
    futures: FutureStore
    usage: UsageLog
    steps: StepLog
    metrics: SchedulerMetrics
    clock: Callable[[], float]
    _tokens_since_step: Counter[str] = field(default_factory=Counter, init=False)

    # ---- clock thread ---------------------------------------------------------------------

    def complete(self, plan: Plan, outcome: PlanOutcome) -> tuple[list[WorkItem], list[OpUsage]]:
        """Advance the queues past ``plan``'s finished items and deliver each (effects, future,
        metering); returns those items and their usage."""
        finished = self._finish_plan(plan, outcome)
        usage = [self.deliver(f) for f in finished]
        self.usage.add(usage)
        return [f.item for f in finished], usage

    def _finish_plan(self, plan: Plan, outcome: PlanOutcome) -> list[Finished]:
        """Advance the queues past ``plan``'s finished items; returns them."""
        with self.state.lock:
            match plan:
                case SamplePlan():
                    return self._finish_samples(outcome)
                case ReleasePlan():
                    return []
                case CyclePlan() | ExpirePlan():
                    items = list(plan.items)
                case ControlPlan():
                    items = [plan.item]
                case InstallPlan():
                    items = [i.item for i in plan.installs if i.item is not None]
                case _:
                    assert_never(plan)
            shares = engine_shares(plan, outcome)
            finished = []
            for item in items:
                result = outcome.bug or outcome.outcomes.get(item.request_id)
                if result is None:
                    result = server_bug(RuntimeError("executor dropped a work item"), "complete")
                queue = self.state.queue_of(item)
                queue.finish_one()
                self.state.op_done(item.tenant)
                finished.append(Finished(item, result, shares.get(item.request_id, 0.0),
                                         queue.base_model))
            return finished

    def _finish_samples(self, outcome: PlanOutcome) -> list[Finished]:
        samples = self.state.samples
        samples.charge(outcome.engine_s)
        ids = samples.running_ids() if outcome.bug else list(outcome.outcomes)
        finished = []
        for rid in ids:
            done = samples.finish(rid)
            if done is None:
                continue
            item, engine_s = done
            op = sample_op(item)
            if op.work.adapter_id is not None:
                self.state.residency.release(op.work.adapter_id)
            self.state.op_done(item.tenant)
            finished.append(Finished(item, outcome.bug or outcome.outcomes[rid], engine_s,
                                     op.base_model))
        return finished

    def installed_sampler_adapters(self, plan: InstallPlan, outcome: PlanOutcome) -> None:
        """Samples waiting for these adapters may run now (or fail, if installing failed)."""
        for install in plan.installs:
            if install.item is not None:
                continue
            error = outcome.bug or outcome.install_errors.get(install.adapter_id)
            if error is not None:
                self._fail_waiting(install.adapter_id, error)
            else:
                with self.state.lock:
                    self.state.residency.mark_installed(install.adapter_id)
                    self.state.done_reading(install.adapter_id)

    # ---- IO threads -----------------------------------------------------------------------

    def run_io_op(self, item: WorkItem, started_at: float) -> None:
        """A save (write, encrypt, commit) or the read half of a load, on an IO thread."""
        began = time.perf_counter()
        op = item.op
        match op:
            case SaveOp():
                work = SaveWork(adapter_id=op.model_id, directory=op.checkpoint.directory,
                                with_optimizer=op.with_optimizer, peft_export=True)
                saved = _guarded(lambda: self.executor.save_adapter(work), "save_adapter",
                                 self.effects.checkpoints.storage_error)
                self._finish_io(item, saved, began, started_at)
            case LoadOp():
                read = _guarded(lambda: self.executor.read_checkpoint(op.work),
                                "read_checkpoint")
                if isinstance(read, LoraplexError):
                    self._finish_io(item, read, began, started_at)
                    return
                with self.state.lock:
                    queued = self.state.add_install(Install(op.work.adapter_id, read, item))
                if not queued:  # read just before its worker was lost: fail it, retryably
                    lost = WorkerLostError("the engine worker was lost before this load "
                                           "was installed; retry it")
                    self._finish_io(item, lost, began, started_at)
            case (CreateModelOp() | ForwardBackwardWork() | OptimStepWork() | SnapshotOp()
                  | SampleOp() | FailedOp()):
                raise AssertionError(f"{item.request_id}: {item.kind} has no IO work")
            case _:
                assert_never(op)

    def read_sampler_adapter(self, adapter_id: str, directory: str) -> None:
        """Read a sampler's checkpoint for the samples waiting on it (IO thread)."""
        work = LoadWork(adapter_id, directory, with_optimizer=False, frozen=True)
        read = _guarded(lambda: self.executor.read_checkpoint(work), "read_checkpoint")
        if isinstance(read, LoraplexError):
            self._fail_waiting(adapter_id, read)
            return
        with self.state.lock:
            self.state.add_install(Install(adapter_id, read))

    def _finish_io(self, item: WorkItem, result: ItemOutcome, began: float,
                   started_at: float) -> None:
        if isinstance(result, WorkerLostError):
            with self.state.lock:
                if self.state.io_lost(item, result):
                    return  # failed by the evacuation, with the restore checkpoint in its message
        io_s = time.perf_counter() - began
        with self.state.lock:
            queue = self.state.queue_of(item)
        usage = self.deliver(Finished(item, result, io_s, queue.base_model))
        with self.state.lock:
            queue.finish_one()
            self.state.op_done(item.tenant)
            self.state.notify_locked()
        self.usage.add([usage])
        self.metrics.io_done(item, io_s, usage, started_at, started_at - item.enqueued_at)

    def _fail_waiting(self, adapter_id: str, error: LoraplexError) -> None:
        with self.state.lock:
            items = self.state.samples.take_waiting(
                lambda it: sample_op(it).work.adapter_id == adapter_id)
            self.state.done_reading(adapter_id)
            for item in items:
                self.state.op_done(item.tenant)
        self.fail_unstarted((it, error, sample_op(it).base_model) for it in items)

    # ---- any thread -----------------------------------------------------------------------

    def fail_unstarted(self, failures: Iterable[tuple[WorkItem, LoraplexError, str | None]]
                       ) -> None:
        """Fail ops that never ran (already taken off their queues), each with its own error
        and base model, and meter them."""
        self.usage.add([self.deliver(Finished(item, error, 0.0, base_model))
                         for item, error, base_model in failures])

    def deliver(self, done: Finished) -> OpUsage:
        """Apply the effects of a finished op and resolve (or fail) its future."""
        item, result = done.item, done.result
        if not isinstance(result, LoraplexError):
            try:
                self._note_success(item, result)
                value = self.effects.succeeded(item, result,
                                               trained_tokens=self._step_tokens(item))
            except LoraplexError as exc:
                result = exc
            except Exception as exc:  # a store failure must not kill the clock loop
                result = server_bug(exc, f"effects of {item.kind}")
            else:
                self.futures.resolve(item.request_id, value)
                point = step_point(item, result)
                if point is not None:
                    self.steps.add([point])
        if isinstance(result, LoraplexError):
            self._fail(item, result)
        self.metrics.op_finished(item.kind, self.clock() - item.enqueued_at)
        return op_usage(item, result, done.engine_s, done.base_model)

    def _note_success(self, item: WorkItem, result: ItemOutcome) -> None:
        """Scheduler-side bookkeeping of a success: tokens since the last step, and the new
        sampler version a snapshot created."""
        op = item.op
        with self.state.lock:
            match op:
                case ForwardBackwardWork():
                    if not op.forward_only:
                        self._tokens_since_step[op.adapter_id] += op.num_tokens
                case SnapshotOp():
                    if isinstance(result, AdapterReady):
                        self.state.residency.add_snapshot(op.model_id, result.adapter_id,
                                                           inflight=op.kind == "inflight")
                case (CreateModelOp() | LoadOp() | OptimStepWork() | SaveOp() | SampleOp()
                      | FailedOp()):
                    pass
                case _:
                    assert_never(op)

    def _step_tokens(self, item: WorkItem) -> int:
        if not isinstance(item.op, OptimStepWork):
            return 0
        with self.state.lock:
            return self._tokens_since_step.pop(item.op.adapter_id, 0)

    def _fail(self, item: WorkItem, error: LoraplexError) -> None:
        if item.model_id is not None and new_run_of(item.op) is not None:
            with self.state.lock:  # the run never came to life: drop its queue
                self.state.close_model(item.model_id)
        try:
            self.effects.failed(item, error)
        finally:
            self.futures.fail(item.request_id, error)


def _guarded(call: Callable[[], T], what: str,
             translate: Callable[[BaseException], LoraplexError] | None = None
             ) -> T | LoraplexError:
    """``call()``, or the error that failed it: an unexpected exception is ``translate``d (a
    checkpoint write's full disk), else a logged bug."""
    try:
        return call()
    except LoraplexError as exc:
        return exc
    except Exception as exc:
        return translate(exc) if translate is not None else server_bug(exc, what)

