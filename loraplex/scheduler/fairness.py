"""Deficit round-robin by tokens across tenants, for packing one training batch.

Each round every tenant with ready work earns ``quantum`` tokens of credit and spends it on its
oldest ready ops; credit carries over while the tenant stays backlogged and resets when it has
nothing ready, so a tenant with a deep queue (or huge ops) cannot starve small ones, and a
tenant's long-run share of batch tokens converges to 1/K among K backlogged tenants.
"""

from __future__ import annotations

from collections import defaultdict

from loraplex.scheduler.ops import WorkItem


class DeficitRoundRobin:
    """Selects the ops of one batch under a token budget.

    Args:
        quantum: tokens of credit per tenant per round.
    """

    def __init__(self, quantum: int) -> None:
        self.quantum = max(1, quantum)
        self._deficit: dict[str, int] = defaultdict(int)
        self._order: list[str] = []

    def select(self, candidates: list[WorkItem], budget: int) -> list[WorkItem]:
        """Pick ops to run now (never empty if ``candidates`` is not: a single op larger than
        the budget runs alone)."""
        by_tenant: dict[str, list[WorkItem]] = defaultdict(list)
        for item in sorted(candidates, key=lambda it: it.enqueued_at):
            by_tenant[item.tenant].append(item)
        for tenant in list(self._deficit):
            if tenant not in by_tenant:
                del self._deficit[tenant]
        self._order = [t for t in self._order if t in by_tenant] + sorted(
            t for t in by_tenant if t not in self._order)
        chosen: list[WorkItem] = []
        used = 0
        progress = True
        while progress and any(by_tenant.values()):
            progress = False
            for tenant in self._order:
                queue = by_tenant[tenant]
                if not queue:
                    continue
                self._deficit[tenant] += self.quantum
                while queue and queue[0].num_tokens <= self._deficit[tenant]:
                    cost = queue[0].num_tokens
                    if chosen and used + cost > budget:
                        return self._finish(chosen)
                    chosen.append(queue.pop(0))
                    self._deficit[tenant] -= cost
                    used += cost
                    progress = True
                if not queue:
                    self._deficit[tenant] = 0
            if not progress and not chosen:
                progress = True  # keep granting credit until the first op fits
        return self._finish(chosen)

    def _finish(self, chosen: list[WorkItem]) -> list[WorkItem]:
        # Rotate so the next batch starts with the tenant after the last one served.
        if chosen and self._order:
            last = chosen[-1].tenant
            i = self._order.index(last)
            self._order = self._order[i + 1:] + self._order[: i + 1]
        return chosen
