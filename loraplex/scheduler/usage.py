"""Metering hook: what each finished op consumed, kept until the server's meter drains it.

The scheduler makes one `OpUsage` per finished op (appending to a bounded in-memory log: no I/O
on the clock thread); the meter drains the log every few seconds, folds it with `usage_deltas`
and adds the deltas to the SQLite usage store in one transaction. Engine time of a packed call
is shared among its ops in proportion to their tokens; a decode step's among the requests
running in it, by sequences.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import assert_never

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
from loraplex.domain.results import ItemOutcome
from loraplex.domain.sampling import SampleResult
from loraplex.domain.usage import OpUsage, UsageCounts, UsageKey
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.errors import LoraplexError
from loraplex.scheduler.runner import PlanOutcome


class UsageLog:
    """Bounded in-memory log of finished ops, safe to drain from another thread.

    Args:
        max_records: oldest records are dropped past this many undrained ones (a server drains
            every few seconds; a scheduler without a meter just keeps the latest).
    """

    def __init__(self, max_records: int = 200_000) -> None:
        self._lock = threading.Lock()
        self._ops: deque[OpUsage] = deque(maxlen=max_records)

    def add(self, ops: Iterable[OpUsage]) -> None:
        with self._lock:
            self._ops.extend(ops)

    def drain_ops(self) -> list[OpUsage]:
        with self._lock:
            out = list(self._ops)
            self._ops.clear()
            return out


def usage_deltas(ops: Iterable[OpUsage]) -> dict[UsageKey, UsageCounts]:
    """Fold ops into per-(tenant, run, model, kind, hour) counters for the usage store."""
    out: dict[UsageKey, UsageCounts] = {}
    for op in ops:
        previous = out.get(op.key)
        out[op.key] = op.counts if previous is None else previous + op.counts
    return out


def op_usage(item: WorkItem, result: ItemOutcome, engine_s: float, base_model: str | None
             ) -> OpUsage:
    """The usage record of ``item`` finished with ``result`` (an error carries no tokens)."""
    op = item.op
    run_id = (op.usage_run_id or op.model_id) if isinstance(op, SampleOp) else item.model_id
    return OpUsage(item.request_id, item.tenant, item.kind, run_id, base_model, time.time(),
                   op_counts(item, result, engine_s))


def op_counts(item: WorkItem, result: ItemOutcome, engine_s: float) -> UsageCounts:
    if isinstance(result, LoraplexError):
        return UsageCounts(num_ops=1, num_failed=1, engine_s=engine_s)
    base = UsageCounts(num_ops=1, engine_s=engine_s)
    op = item.op
    match op:
        case ForwardBackwardWork():
            if op.forward_only:
                return base + UsageCounts(forward_tokens=op.num_tokens)
            return base + UsageCounts(trained_tokens=op.num_tokens)
        case SampleOp():
            if not isinstance(result, SampleResult):
                return base
            prompt = len(op.work.prompt)
            return base + UsageCounts(
                prompt_tokens=prompt, rollout_prompt_tokens=prompt * op.work.num_samples,
                cache_hit_tokens=min(prompt, result.prompt_cache_hit_tokens),
                sampled_tokens=sum(len(s.tokens) for s in result.sequences),
                num_sequences=len(result.sequences))
        case (CreateModelOp() | LoadOp() | OptimStepWork() | SaveOp() | SnapshotOp()
              | FailedOp()):
            return base
        case _:
            assert_never(op)


def engine_shares(plan: Plan, outcome: PlanOutcome) -> dict[str, float]:
    """Engine seconds per item: a cycle's batch time by tokens, its optim time evenly; a
    control or install plan's time evenly among its items."""
    match plan:
        case CyclePlan():
            engine = [it for it in plan.batch if not isinstance(it.op, FailedOp)]
            tokens = sum(it.num_tokens for it in engine)
            shares = {it.request_id: outcome.train_s * (it.num_tokens / tokens if tokens
                                                        else 1 / len(engine))
                      for it in engine}
            for item in plan.optim:
                shares[item.request_id] = outcome.optim_s / len(plan.optim)
            return shares
        case ControlPlan():
            return {plan.item.request_id: outcome.engine_s}
        case InstallPlan():
            items = [i.item for i in plan.installs if i.item is not None]
            return {it.request_id: outcome.engine_s / len(items) for it in items}
        case SamplePlan() | ExpirePlan() | ReleasePlan():
            return {}
        case _:
            assert_never(plan)
