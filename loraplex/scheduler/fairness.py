"""Deficit round-robin by tokens across tenants: who gets into the next batch.

Each round every tenant with ready work earns ``quantum`` tokens of credit and spends it on the
head of its own ordered list; credit carries over while the tenant stays backlogged and resets
when it has nothing ready, so a tenant with a deep queue (or huge ops) cannot starve small ones,
and a tenant's long-run share of batch tokens converges to 1/K among K backlogged tenants. The
next call starts with the tenant after the last one served. Used twice: for the training batch
of a clock cycle (cost = datum tokens) and for sampling admission (cost = KV reservation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from loraplex.domain.ops import WorkItem


def datum_tokens(item: WorkItem) -> int:
    return item.num_tokens


class DeficitRoundRobin:
    """Selects a batch under a budget; only a prefix of each tenant's list is ever taken.

    Args:
        quantum: credit per tenant per round (tokens).
        cost: an item's price in the budget's unit.
    """

    def __init__(self, quantum: int, cost: Callable[[WorkItem], int] = datum_tokens) -> None:
        self.quantum = max(1, quantum)
        self.cost = cost
        self._deficit: dict[str, int] = {}
        self._order: list[str] = []

    def select(self, queues: Mapping[str, Sequence[WorkItem]], budget: int,
               allow_oversize: bool = True, caps: Mapping[str, int] | None = None,
               also: tuple[Callable[[WorkItem], int], int] | None = None) -> list[WorkItem]:
        """Pick items to run now.

        Args:
            queues: per tenant, its ready items in the order they must be served.
            budget: most total cost to select.
            allow_oversize: when nothing fits, still take the first head (a single op larger
                than the budget runs alone instead of never).
            caps: per tenant, the cost after which it takes nothing more this time (it always
                gets its first affordable item); tenants without one are uncapped.
            also: a second price and its budget, kept like ``budget`` (the first item is
                always taken): sampling admission's prompt tokens per step.
        """
        caps = caps or {}
        also_cost, also_budget = also or ((lambda item: 0), 0)
        also_used = 0
        taken: dict[str, int] = {}
        pending = {t: list(items) for t, items in queues.items() if items}
        self._deficit = {t: d for t, d in self._deficit.items() if t in pending}
        self._order = [t for t in self._order if t in pending] + sorted(
            t for t in pending if t not in self._order)
        chosen: list[WorkItem] = []
        used = 0
        while any(pending.values()):
            progress = False
            for tenant in self._order:
                queue = pending[tenant]
                if not queue:
                    continue
                self._deficit[tenant] = self._deficit.get(tenant, 0) + self.quantum
                while queue and self.cost(queue[0]) <= self._deficit[tenant]:
                    price, extra = self.cost(queue[0]), also_cost(queue[0])
                    if used + price > budget and (chosen or not allow_oversize):
                        return self._rotate(chosen)
                    if chosen and also_used + extra > also_budget:
                        return self._rotate(chosen)
                    chosen.append(queue.pop(0))
                    self._deficit[tenant] -= price
                    used += price
                    also_used += extra
                    taken[tenant] = taken.get(tenant, 0) + price
                    progress = True
                    if tenant in caps and taken[tenant] >= caps[tenant]:
                        queue.clear()  # its share of this call is used; credit stays
                        break
                else:
                    if not queue:
                        self._deficit[tenant] = 0
            if not progress:
                self._skip_empty_rounds(pending)
        return self._rotate(chosen)

    def _skip_empty_rounds(self, pending: Mapping[str, Sequence[WorkItem]]) -> None:
        """No head was affordable this round: grant at once the credit of the rounds it would
        take until one is (the same credit to every backlogged tenant, so order is kept)."""
        backlogged = [t for t, q in pending.items() if q]
        rounds = min(-(-(self.cost(pending[t][0]) - self._deficit[t]) // self.quantum)
                     for t in backlogged)
        for tenant in backlogged:
            self._deficit[tenant] += max(0, rounds - 1) * self.quantum

    def _rotate(self, chosen: list[WorkItem]) -> list[WorkItem]:
        if chosen:
            i = self._order.index(chosen[-1].tenant)
            self._order = self._order[i + 1:] + self._order[: i + 1]
        return chosen
