"""`MemoryCache`: the last `AdapterMemory` a worker reported, so that placing a new training
run (`scheduler.lanes`, on every create) does not ask every worker over the network.

Exact, not a guess: a worker's adapter memory changes only in the calls its lane's clock
thread makes, so the executor drops the cached value when such a call starts (`changing`) and
keeps what the worker answered beside a cycle's or a sample step's outcomes (`put`); the other
changing calls (create, delete, install, snapshot) leave it empty until the next such answer or
the next `get`, which asks. A reading that raced a change is never kept (versions).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from loraplex.domain.results import AdapterMemory


class MemoryCache:
    """One worker's adapter memory as of its last call (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: AdapterMemory | None = None
        self._version = 0

    def changing(self) -> int:
        """A call that may change the worker's memory starts: forget the value; returns the
        version its answer is `put` under."""
        with self._lock:
            self._version += 1
            self._value = None
            return self._version

    def put(self, version: int, memory: AdapterMemory) -> None:
        """Keep ``memory``, unless another change started since ``version``."""
        with self._lock:
            if version == self._version:
                self._value = memory

    def get(self, ask: Callable[[], AdapterMemory]) -> AdapterMemory:
        """The kept value, or ``ask()``'s answer (kept unless a change started meanwhile)."""
        with self._lock:
            if self._value is not None:
                return self._value
            version = self._version
        memory = ask()
        self.put(version, memory)
        return memory
