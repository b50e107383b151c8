"""Executes one plan against a `BatchExecutor`: the only module that calls the engine.

Returns one outcome per finished work item (an engine result, or the `LoraplexError` that
failed that item alone). An unexpected exception from an engine call is a bug: it is logged with
its traceback under a fresh error id, and every item of that call fails with a `ServerError`
carrying only the id, so the clock loop keeps running and no stack trace reaches a client. A
cycle's optim_step is not applied when its model's forward_backward in the same cycle crashed
the batch call (it fails with the same error instead of stepping on partial gradients).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from loraplex.domain.work import SaveWork
from loraplex.errors import LoraplexError, ServerError
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.ops import (
    CreateModelOp,
    FailedOp,
    ForwardBackwardOp,
    LoadOp,
    OptimStepOp,
    ReleaseOp,
    SampleOp,
    SaveOp,
    SnapshotOp,
    WorkItem,
)
from loraplex.scheduler.plan import (
    ControlPlan,
    CyclePlan,
    ExpirePlan,
    Plan,
    ReleasePlan,
    SamplePlan,
)

log = logging.getLogger("loraplex.scheduler")


@dataclass
class PlanOutcome:
    """Per-request outcomes of one engine call and its wall time.

    Attributes:
        outcomes: request_id → engine result or LoraplexError, for items that finished.
        engine_s: seconds spent inside the executor.
        train_s, optim_s: a cycle's forward_backward and optim_step parts of ``engine_s``.
        bug: the server error raised for a whole-call failure of a sample step or a release
            (None when the call worked; a cycle's failed calls fail their own items instead).
    """

    outcomes: dict[str, Any] = field(default_factory=dict)
    engine_s: float = 0.0
    train_s: float = 0.0
    optim_s: float = 0.0
    bug: ServerError | None = None


def server_bug(exc: BaseException, what: str) -> ServerError:
    """Log ``exc`` with its traceback under a new error id; return the client-safe error."""
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s during %s", error_id, what, exc_info=exc)
    return ServerError(f"internal server error (error id {error_id})")


def run_plan(executor: BatchExecutor, plan: Plan) -> PlanOutcome:
    out = PlanOutcome()
    start = time.perf_counter()
    try:
        _dispatch(executor, plan, out)
    except LoraplexError as exc:
        # Only single-item calls may raise domain errors; they fail that item alone.
        if not isinstance(plan, ControlPlan):
            out.bug = server_bug(exc, f"{type(plan).__name__} raised a domain error")
        else:
            out.outcomes[plan.item.request_id] = exc
    except Exception as exc:  # a bug in the engine call: isolate it, keep the loop alive
        out.bug = server_bug(exc, type(plan).__name__)
    out.engine_s = time.perf_counter() - start
    return out


def _dispatch(executor: BatchExecutor, plan: Plan, out: PlanOutcome) -> None:
    if isinstance(plan, CyclePlan):
        _run_cycle(executor, plan, out)
    elif isinstance(plan, SamplePlan):
        admit = [_op(it, SampleOp).work for it in plan.admit]
        for request_id, outcome in executor.sample_step(admit, plan.max_decode_steps):
            out.outcomes[request_id] = outcome
    elif isinstance(plan, ExpirePlan):
        for item in plan.items:
            out.outcomes[item.request_id] = plan.error
    elif isinstance(plan, ReleasePlan):
        for adapter_id in plan.adapter_ids:
            executor.delete_adapter(adapter_id)
    else:
        out.outcomes[plan.item.request_id] = _control(executor, plan.item)


def _run_cycle(executor: BatchExecutor, plan: CyclePlan, out: PlanOutcome) -> None:
    """The batch's forward_backward call, then the optim_step call (see module docstring)."""
    engine = [it for it in plan.batch if not isinstance(it.op, FailedOp)]
    for item in plan.batch:
        if isinstance(item.op, FailedOp):
            out.outcomes[item.request_id] = item.op.error
    crashed: set[str] = set()
    start = time.perf_counter()
    if engine:
        error = _call(out, engine, lambda: executor.forward_backward(
            [_op(it, ForwardBackwardOp).work for it in engine]), "forward_backward")
        if error is not None:
            crashed = {it.model_id for it in engine if it.model_id is not None}
            for item in plan.optim:
                if item.model_id in crashed:
                    out.outcomes[item.request_id] = error
    out.train_s = time.perf_counter() - start
    steps = [it for it in plan.optim if it.model_id not in crashed]
    start = time.perf_counter()
    if steps:
        _call(out, steps, lambda: executor.optim_step(
            [_op(it, OptimStepOp).work for it in steps]), "optim_step")
    out.optim_s = time.perf_counter() - start


def _call(out: PlanOutcome, items: list[WorkItem], call: Any, what: str) -> ServerError | None:
    """Run one batch call; a crash fails its items alone and is returned."""
    try:
        outcomes = call()
        if len(outcomes) != len(items):
            raise RuntimeError(f"executor returned {len(outcomes)} outcomes for "
                               f"{len(items)} works")
    except Exception as exc:  # a bug in the engine call: isolate it, keep the loop alive
        error = server_bug(exc, what)
        for item in items:
            out.outcomes[item.request_id] = error
        return error
    for item, outcome in zip(items, outcomes, strict=True):
        out.outcomes[item.request_id] = outcome
    return None


def _control(executor: BatchExecutor, item: WorkItem) -> Any:
    op = item.op
    if isinstance(op, FailedOp):
        return op.error
    if isinstance(op, CreateModelOp):
        return executor.create_adapter(op.run.model_id, op.run.lora)
    if isinstance(op, LoadOp):
        return executor.load_adapter(op.work)
    if isinstance(op, SaveOp):
        return executor.save_adapter(SaveWork(
            adapter_id=op.model_id, directory=op.checkpoint.directory,
            with_optimizer=op.with_optimizer, peft_export=True))
    if isinstance(op, SnapshotOp):
        return executor.snapshot_adapter(op.model_id, snapshot_adapter_id(item))
    if isinstance(op, ReleaseOp):
        for adapter_id in op.adapter_ids:
            executor.delete_adapter(adapter_id)
        return None
    raise AssertionError(f"no control call for {type(op).__name__}")


def snapshot_adapter_id(item: WorkItem) -> str:
    """Engine id of the sampler version an ephemeral save creates (unique per request)."""
    op = item.op
    assert isinstance(op, SnapshotOp)
    return op.sampler_id if op.kind == "snapshot" else f"{op.model_id}:inflight:{item.request_id}"


def _op(item: WorkItem, kind: type[Any]) -> Any:
    assert isinstance(item.op, kind), f"{item.request_id}: {type(item.op).__name__} in wrong plan"
    return item.op
