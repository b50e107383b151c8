"""Executes one plan against a `BatchExecutor` on the clock thread: the only module that calls
the engine there (the IO threads' two calls, ``save_adapter`` and ``read_checkpoint``, live in
`completion.py`).

Returns one outcome per finished work item (an engine result, or the `LoraplexError` that
failed that item alone). An unexpected exception from an engine call is a bug: it is logged with
its traceback under a fresh error id, and every item of that call fails with a `ServerError`
carrying only the id, so the clock loop keeps running and no stack trace reaches a client. A
cycle is one `run_cycle` call (forward_backward, then optim_step; `domain.cycle`): each of its
two batch calls fails alone, and a model's optim_step is not applied when the forward_backward
call of the same cycle crashed (it fails with the same error instead of stepping on partial
gradients).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import assert_never

from loraplex.domain.cycle import CallCrash, crashed_adapters
from loraplex.domain.ops import (
    ControlPlan,
    CreateModelOp,
    CyclePlan,
    ExpirePlan,
    FailedOp,
    InstallPlan,
    LoadOp,
    Plan,
    ReleasePlan,
    SampleOp,
    SamplePlan,
    SaveOp,
    SnapshotOp,
    WorkItem,
)
from loraplex.domain.results import AdapterReady, ItemOutcome
from loraplex.domain.sampling import SequenceDelta
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork, SampleWork
from loraplex.errors import LoraplexError, ServerError, WorkerLostError, server_bug
from loraplex.scheduler.executor import BatchExecutor


@dataclass
class PlanOutcome:
    """Per-request outcomes of one plan and its engine time.

    Attributes:
        outcomes: request_id → engine result or LoraplexError, for items that finished.
        install_errors: adapter id → why installing a sampler adapter failed.
        engine_s: seconds spent inside the executor.
        train_s, optim_s: a cycle's forward_backward and optim_step parts of ``engine_s``.
        bug: the server error raised for a whole-call failure of a sample step or a release
            (None when the call worked; a cycle's failed calls fail their own items instead).
        lost: the engine worker died during the plan: nothing of it may be trusted, and the
            scheduler hands every item it holds to whoever moves its runs elsewhere.
        progress: new tokens of streamed samples still running (a sample plan's).
    """

    outcomes: dict[str, ItemOutcome] = field(default_factory=dict)
    install_errors: dict[str, LoraplexError] = field(default_factory=dict)
    engine_s: float = 0.0
    train_s: float = 0.0
    optim_s: float = 0.0
    bug: ServerError | None = None
    lost: WorkerLostError | None = None
    progress: tuple[SequenceDelta, ...] = ()


def run_plan(executor: BatchExecutor, plan: Plan) -> PlanOutcome:
    out = PlanOutcome()
    start = time.perf_counter()
    try:
        _dispatch(executor, plan, out)
    except WorkerLostError as exc:
        out.lost = exc
    except Exception as exc:  # a bug in the engine call: isolate it, keep the loop alive
        out.bug = server_bug(exc, type(plan).__name__)
    out.engine_s = time.perf_counter() - start
    return out


def _dispatch(executor: BatchExecutor, plan: Plan, out: PlanOutcome) -> None:
    match plan:
        case CyclePlan():
            _run_cycle(executor, plan, out)
        case ControlPlan():
            out.outcomes[plan.item.request_id] = _control(executor, plan.item)
        case SamplePlan():
            admit = [sample_work(it) for it in plan.admit]
            step = executor.sample_step(admit, plan.max_decode_steps, plan.cancel)
            for request_id, outcome in step.finished:
                out.outcomes[request_id] = outcome
            out.progress = step.progress
        case InstallPlan():
            _install(executor, plan, out)
        case ExpirePlan():
            for item in plan.items:
                out.outcomes[item.request_id] = plan.error
        case ReleasePlan():
            for adapter_id in plan.adapter_ids:
                executor.delete_adapter(adapter_id)
        case _:
            assert_never(plan)


def _run_cycle(executor: BatchExecutor, plan: CyclePlan, out: PlanOutcome) -> None:
    """The batch's forward_backward and its optim_steps, as one `run_cycle` call (see the
    module docstring)."""
    engine: list[tuple[WorkItem, ForwardBackwardWork]] = []
    for item in plan.batch:
        match item.op:
            case FailedOp():
                out.outcomes[item.request_id] = item.op.error
            case ForwardBackwardWork():
                engine.append((item, item.op))
            case _:
                raise AssertionError(f"{item.request_id}: {item.kind} in a cycle's batch")
    steps = [(it, optim_work(it)) for it in plan.optim]
    if not engine and not steps:
        return
    start = time.perf_counter()
    try:
        cycle = executor.run_cycle([w for _, w in engine], [w for _, w in steps])
    except WorkerLostError:
        raise
    except Exception as exc:  # a bug outside both batch calls: the cycle's items fail
        _record(out, [*engine, *steps], CallCrash(exc), "run_cycle")
        out.train_s = time.perf_counter() - start
        return
    wall = time.perf_counter() - start
    out.optim_s = min(wall, cycle.optim_s)  # the round trip's own time counts as training
    out.train_s = wall - out.optim_s
    error = _record(out, engine, cycle.forward_backward, "forward_backward")
    crashed = crashed_adapters([w for _, w in engine], cycle.forward_backward)
    for item, work in steps:
        if work.adapter_id in crashed:
            assert error is not None
            out.outcomes[item.request_id] = error
    _record(out, [(it, w) for it, w in steps if w.adapter_id not in crashed], cycle.optim_step,
            "optim_step")


def _record(out: PlanOutcome, items: Sequence[tuple[WorkItem, object]],
            outcomes: Sequence[ItemOutcome] | CallCrash, what: str) -> ServerError | None:
    """Each item's outcome; a crashed call fails its items alone (logged once, one error id)
    and is returned."""
    if not isinstance(outcomes, CallCrash) and len(outcomes) != len(items):
        outcomes = CallCrash(RuntimeError(f"executor returned {len(outcomes)} outcomes for "
                                          f"{len(items)} works"))
    if isinstance(outcomes, CallCrash):
        error = server_bug(outcomes.error, what)
        for item, _ in items:
            out.outcomes[item.request_id] = error
        return error
    for (item, _), outcome in zip(items, outcomes, strict=True):
        out.outcomes[item.request_id] = outcome
    return None


def _control(executor: BatchExecutor, item: WorkItem) -> ItemOutcome:
    op = item.op
    try:
        match op:
            case FailedOp():
                return op.error
            case CreateModelOp():
                executor.create_adapter(op.run.model_id, op.run.lora)
                return AdapterReady(op.run.model_id)
            case SnapshotOp():
                adapter_id = op.adapter_id(item.request_id)
                executor.snapshot_adapter(op.model_id, adapter_id)
                return AdapterReady(adapter_id)
            case LoadOp() | SaveOp() | ForwardBackwardWork() | OptimStepWork() | SampleOp():
                raise AssertionError(f"{item.request_id}: {item.kind} is not a control op")
            case _:
                assert_never(op)
    except WorkerLostError:
        raise
    except LoraplexError as exc:  # a single-item call fails that item alone
        return exc


def _install(executor: BatchExecutor, plan: InstallPlan, out: PlanOutcome) -> None:
    for install in plan.installs:
        try:
            result = executor.install_adapter(install.adapter_id, install.prepared)
        except WorkerLostError:
            raise
        except LoraplexError as exc:
            if install.item is None:
                out.install_errors[install.adapter_id] = exc
            else:
                out.outcomes[install.item.request_id] = exc
            continue
        if install.item is not None:
            out.outcomes[install.item.request_id] = result


def sample_work(item: WorkItem) -> SampleWork:
    match item.op:
        case SampleOp():
            return replace(item.op.work, tenant=item.tenant)  # the sampler shares by tenant
        case _:
            raise AssertionError(f"{item.request_id}: {item.kind} is not a sample")


def optim_work(item: WorkItem) -> OptimStepWork:
    match item.op:
        case OptimStepWork():
            return item.op
        case _:
            raise AssertionError(f"{item.request_id}: {item.kind} is not an optim step")
