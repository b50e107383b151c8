"""Recent queue waits per tenant and class (``train``, ``sample``): what the operator's view
shows as each tenant's p50 / p95 wait.

Bounded twice: the latest ``max_values`` waits per (tenant, class), and at most
``max_tenants`` tenants (the least recently seen is forgotten first), so a flood of one-off
open-access tenants cannot grow it. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable


class TenantWaits:
    def __init__(self, max_values: int = 1024, max_tenants: int = 1024) -> None:
        self.max_values = max_values
        self.max_tenants = max_tenants
        self._lock = threading.Lock()
        self._waits: OrderedDict[str, dict[str, deque[float]]] = OrderedDict()

    def observe(self, cls: str, waits: Iterable[tuple[str, float]]) -> None:
        """Seconds each (tenant, wait) op of class ``cls`` waited in its queue."""
        with self._lock:
            for tenant, wait in waits:
                by_class = self._waits.get(tenant)
                if by_class is None:
                    by_class = self._waits[tenant] = {}
                    while len(self._waits) > self.max_tenants:
                        self._waits.popitem(last=False)
                self._waits.move_to_end(tenant)
                values = by_class.get(cls)
                if values is None:
                    values = by_class[cls] = deque(maxlen=self.max_values)
                values.append(wait)

    def snapshot(self) -> dict[str, dict[str, list[float]]]:
        """Per tenant, per class: the recent waits, oldest first."""
        with self._lock:
            return {t: {c: list(v) for c, v in by_class.items()}
                    for t, by_class in self._waits.items()}
