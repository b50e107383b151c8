"""`Tier`: the adapters held in one place (device, host memory or disk), oldest first, with the
byte total of what they hold kept as they come and go. Plain bookkeeping: knows nothing of
tensors or of how entries move between tiers."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Tier(Generic[T]):
    """Adapter id → entry (what the tier holds for it), in insertion order: oldest first."""

    def __init__(self, size: Callable[[T], int]) -> None:
        """Args:
            size: an entry's bytes (counted into `nbytes` when it enters, out when it leaves).
        """
        self._entries: OrderedDict[str, T] = OrderedDict()
        self._size = size
        self.nbytes = 0

    def put(self, adapter_id: str, entry: T) -> None:
        """Add or replace an entry, as the newest."""
        self.discard(adapter_id)
        self._entries[adapter_id] = entry
        self.nbytes += self._size(entry)

    def pop(self, adapter_id: str) -> T:
        entry = self._entries.pop(adapter_id)
        self.nbytes -= self._size(entry)
        return entry

    def discard(self, adapter_id: str) -> T | None:
        return self.pop(adapter_id) if adapter_id in self._entries else None

    def get(self, adapter_id: str) -> T | None:
        return self._entries.get(adapter_id)

    def touch(self, adapter_id: str) -> None:
        """Make an entry the newest."""
        self._entries.move_to_end(adapter_id)

    def ids(self) -> list[str]:
        """Oldest first (a copy: safe to change the tier while walking it)."""
        return list(self._entries)

    def __contains__(self, adapter_id: object) -> bool:
        return adapter_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)
