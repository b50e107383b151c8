"""Packs one training clock cycle from the models' ready runs.

A run (`ModelQueue.ready_run`) is a model's consecutive forward / forward_backward ops,
optionally closed by its optim_step. The packer takes a prefix of each tenant's runs by deficit
round-robin up to ``token_budget`` datum tokens (``timeslice``: one model per cycle, the one
whose ready work waited longest, so models take turns in arrival order)
and adds a model's optim_step when all of its run's batch ops made it in, so that step lands in
the same cycle as the forward_backward before it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from loraplex.config import SchedulerConfig
from loraplex.domain.ops import WorkItem
from loraplex.domain.work import OptimStepWork
from loraplex.scheduler.fairness import DeficitRoundRobin


@dataclass(frozen=True)
class PackedCycle:
    """What a cycle carries.

    Attributes:
        batch: forward / forward_backward (and pre-failed) ops, model by model in seq order.
        optim: optim steps applied after the batch.
        started: per model, the ops it starts (a prefix of its run), in seq order.
    """

    batch: tuple[WorkItem, ...]
    optim: tuple[WorkItem, ...]
    started: dict[str, list[WorkItem]]


class CyclePacker:
    """Stateful across cycles (DRR credit).

    Args:
        quantum: DRR credit per tenant per round (tokens).
    """

    def __init__(self, quantum: int) -> None:
        self._fairness = DeficitRoundRobin(quantum)

    def pack(self, runs: dict[str, list[WorkItem]], config: SchedulerConfig) -> PackedCycle:
        """Choose the cycle's ops from ``runs`` (model id → its non-empty ready run) under
        ``config.token_budget`` (``config.timeslice``: one model)."""
        fwd = {m: [it for it in r if not isinstance(it.op, OptimStepWork)]
               for m, r in runs.items()}
        order = sorted(runs, key=lambda m: runs[m][0].enqueued_at)
        if config.timeslice:
            # Oldest head first: a model that just ran resubmits behind the ones still waiting.
            # (A turn counter over a changing ready set skips models: fairness 12× at K=16.)
            model = order[0]
            runs = {model: runs[model]}
            chosen = _prefix_within(fwd[model], config.token_budget)
        else:
            by_tenant: defaultdict[str, list[WorkItem]] = defaultdict(list)
            for m in order:
                by_tenant[runs[m][0].tenant].extend(fwd[m])
            chosen = self._fairness.select(by_tenant, config.token_budget)
        taken = Counter(it.model_id for it in chosen)
        batch: list[WorkItem] = []
        optim: list[WorkItem] = []
        started: dict[str, list[WorkItem]] = {}
        for model_id in order:
            if model_id not in runs:
                continue
            items = fwd[model_id][: taken[model_id]]
            batch.extend(items)
            last = runs[model_id][-1]
            if len(items) == len(fwd[model_id]) and isinstance(last.op, OptimStepWork):
                optim.append(last)
                items = [*items, last]
            if items:
                started[model_id] = items
        return PackedCycle(tuple(batch), tuple(optim), started)


def _prefix_within(items: list[WorkItem], budget: int) -> list[WorkItem]:
    """The longest prefix of ``items`` within ``budget`` tokens (at least one item)."""
    out: list[WorkItem] = []
    used = 0
    for item in items:
        if out and used + item.num_tokens > budget:
            break
        out.append(item)
        used += item.num_tokens
    return out
