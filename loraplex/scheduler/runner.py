"""Executes one plan against a `BatchExecutor`: the only module that calls the engine.

Returns one outcome per finished work item (an engine result, or the `LoraplexError` that
failed that item alone). An unexpected exception from an engine call is a bug: it is logged with
its traceback under a fresh error id, and every item of that call fails with a `ServerError`
carrying only the id, so the clock loop keeps running and no stack trace reaches a client.
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
    OptimPlan,
    Plan,
    ReleasePlan,
    SamplePlan,
    TrainPlan,
)

log = logging.getLogger("loraplex.scheduler")


@dataclass
class PlanOutcome:
    """Per-request outcomes of one engine call and its wall time.

    Attributes:
        outcomes: request_id → engine result or LoraplexError, for items that finished.
        engine_s: seconds spent inside the executor.
        bug: the server error raised for a whole-call failure (None when the call worked).
    """

    outcomes: dict[str, Any] = field(default_factory=dict)
    engine_s: float = 0.0
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
        # Only single-item calls raise domain errors; they fail that item alone.
        assert isinstance(plan, ControlPlan), f"batch call raised {exc!r}"
        out.outcomes[plan.item.request_id] = exc
    except Exception as exc:  # a bug in the engine call: isolate it, keep the loop alive
        out.bug = server_bug(exc, type(plan).__name__)
    out.engine_s = time.perf_counter() - start
    return out


def _dispatch(executor: BatchExecutor, plan: Plan, out: PlanOutcome) -> None:
    if isinstance(plan, TrainPlan):
        works = [_op(it, ForwardBackwardOp).work for it in plan.items]
        _zip(out, plan.items, executor.forward_backward(works))
    elif isinstance(plan, OptimPlan):
        works_o = [_op(it, OptimStepOp).work for it in plan.items]
        _zip(out, plan.items, executor.optim_step(works_o))
    elif isinstance(plan, SamplePlan):
        admit = [_op(it, SampleOp).work for it in plan.admit]
        for request_id, outcome in executor.sample_step(admit, plan.max_decode_steps):
            out.outcomes[request_id] = outcome
    elif isinstance(plan, ReleasePlan):
        for adapter_id in plan.adapter_ids:
            executor.delete_adapter(adapter_id)
    else:
        out.outcomes[plan.item.request_id] = _control(executor, plan.item)


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


def _zip(out: PlanOutcome, items: tuple[WorkItem, ...], outcomes: list[Any]) -> None:
    if len(outcomes) != len(items):
        raise RuntimeError(f"executor returned {len(outcomes)} outcomes for {len(items)} works")
    for item, outcome in zip(items, outcomes, strict=True):
        out.outcomes[item.request_id] = outcome


def _op(item: WorkItem, kind: type[Any]) -> Any:
    assert isinstance(item.op, kind), f"{item.request_id}: {type(item.op).__name__} in wrong plan"
    return item.op
