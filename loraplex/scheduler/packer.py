"""Packs one training clock cycle from the models' ready runs.

A run (`ModelQueue.ready_run`) is a model's consecutive forward / forward_backward ops,
optionally closed by its optim_step. The packer takes a prefix of each tenant's runs by deficit
round-robin up to ``token_budget`` datum tokens (``timeslice``: one model per cycle, the one
whose ready work waited longest, so models take turns in arrival order)
and adds a model's optim_step when all of its run's batch ops made it in, so that step lands in
the same cycle as the forward_backward before it.

Latency fairness: a tenant flooding the server with ready work must not make every cycle long,
or the light tenants' steps (whose latency is one cycle) wait behind it. So while other tenants
have been active within ``latency_fair_window_s``, a tenant takes at most about as many tokens
per cycle as the largest demand any of them had when it was last ready, or
``latency_fair_floor_tokens`` if that is more (always at least one op); alone, a tenant fills
the whole ``token_budget``. The flooder's throughput drops while
others train, and recovers the moment they stop.
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
        self._last_demand: dict[str, tuple[int, float]] = {}  # tenant → (tokens, when)

    def pack(self, runs: dict[str, list[WorkItem]], config: SchedulerConfig, now: float = 0.0
             ) -> PackedCycle:
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
            caps = self._caps(by_tenant, config, now)
            chosen = self._fairness.select(by_tenant, config.token_budget, caps=caps)
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


    def _caps(self, by_tenant: dict[str, list[WorkItem]], config: SchedulerConfig, now: float
              ) -> dict[str, int]:
        """Per-tenant token caps for this cycle (see the module docstring)."""
        window_s = config.latency_fair_window_s
        for tenant, items in by_tenant.items():
            self._last_demand[tenant] = (sum(it.num_tokens for it in items), now)
        self._last_demand = {t: v for t, v in self._last_demand.items()
                             if now - v[1] <= window_s}
        if window_s <= 0 or len(self._last_demand) < 2:
            return {}
        return {t: max(config.latency_fair_floor_tokens,
                       *(d for other, (d, _) in self._last_demand.items() if other != t))
                for t in by_tenant}


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
