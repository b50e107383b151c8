"""Metering hook: what each finished op consumed, kept until the server's meter drains it.

The scheduler makes one `OpUsage` per finished op on the clock thread (appending to a bounded
in-memory log: no I/O there); the meter drains the log every few seconds, folds it with
`usage_deltas` and adds the deltas to the SQLite usage store in one transaction. Engine time of
a packed call is shared among its ops in proportion to their tokens; a decode step's among the
requests running in it, by sequences.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from loraplex.domain.sampling import SampleResult
from loraplex.errors import LoraplexError
from loraplex.scheduler.ops import FailedOp, ForwardBackwardOp, SampleOp, WorkItem
from loraplex.scheduler.plan import ControlPlan, CyclePlan, Plan
from loraplex.scheduler.runner import PlanOutcome
from loraplex.store.usage import UsageCounts, UsageKey


@dataclass(frozen=True)
class OpUsage:
    """What one op consumed.

    Attributes:
        kind: the op's request type (``ForwardBackward``, ``Forward``, ``Sample``, ...).
        run_id: the training run it belongs to (a sample: the run behind its sampler or the
            run that wrote its checkpoint; None for the bare base model).
        base_model: the served NAME (None when unknown).
        finished_at: wall-clock time it finished (Unix seconds).
        engine_s: its share of engine time.
        failed: it failed (then it carries no tokens).
        trained_tokens: datum tokens of a forward_backward.
        forward_tokens: datum tokens of a forward-only pass.
        prompt_tokens: prompt length of a sample request (prefilled once for all its samples).
        rollout_prompt_tokens: prompt length × num_samples (per-rollout billing's count).
        cache_hit_tokens: prompt tokens the engine served from its prefix cache.
        sampled_tokens: tokens generated.
        num_sequences: completions generated.
    """

    request_id: str
    tenant: str
    kind: str
    run_id: str | None
    base_model: str | None
    finished_at: float
    engine_s: float
    failed: bool = False
    trained_tokens: int = 0
    forward_tokens: int = 0
    prompt_tokens: int = 0
    rollout_prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    sampled_tokens: int = 0
    num_sequences: int = 0


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
        key = UsageKey(op.tenant, op.run_id or "", op.base_model or "", op.kind,
                       int(op.finished_at) // 3600 * 3600)
        counts = UsageCounts(
            num_ops=1, num_failed=int(op.failed), engine_s=op.engine_s,
            trained_tokens=op.trained_tokens, forward_tokens=op.forward_tokens,
            prompt_tokens=op.prompt_tokens, rollout_prompt_tokens=op.rollout_prompt_tokens,
            cache_hit_tokens=op.cache_hit_tokens, sampled_tokens=op.sampled_tokens,
            num_sequences=op.num_sequences)
        previous = out.get(key)
        out[key] = counts if previous is None else previous + counts
    return out


def op_usage(item: WorkItem, result: Any, engine_s: float, base_model: str | None) -> OpUsage:
    """The usage record of ``item`` finished with ``result`` (an error carries no tokens)."""
    op = item.op
    failed = isinstance(result, LoraplexError)
    run_id = (op.usage_run_id or op.model_id) if isinstance(op, SampleOp) else item.model_id
    usage = OpUsage(item.request_id, item.tenant, item.kind, run_id, base_model, time.time(),
                    engine_s, failed=failed)
    if failed:
        return usage
    if isinstance(op, ForwardBackwardOp):
        tokens = op.work.num_tokens
        if op.work.forward_only:
            return replace(usage, forward_tokens=tokens)
        return replace(usage, trained_tokens=tokens)
    if isinstance(op, SampleOp) and isinstance(result, SampleResult):
        prompt = len(op.work.prompt)
        return replace(
            usage, prompt_tokens=prompt, rollout_prompt_tokens=prompt * op.work.num_samples,
            cache_hit_tokens=min(prompt, result.prompt_cache_hit_tokens),
            sampled_tokens=sum(len(s.tokens) for s in result.sequences),
            num_sequences=len(result.sequences))
    return usage


def engine_shares(plan: Plan, outcome: PlanOutcome) -> dict[str, float]:
    """Engine seconds per item: a cycle's batch time by tokens, its optim time evenly."""
    if isinstance(plan, ControlPlan):
        return {plan.item.request_id: outcome.engine_s}
    if not isinstance(plan, CyclePlan):
        return {}
    engine = [it for it in plan.batch if not isinstance(it.op, FailedOp)]
    tokens = sum(it.num_tokens for it in engine)
    shares = {it.request_id: outcome.train_s * (it.num_tokens / tokens if tokens
                                                else 1 / len(engine)) for it in engine}
    for item in plan.optim:
        shares[item.request_id] = outcome.optim_s / len(plan.optim)
    return shares
