"""The future store: request_id → pending | done | failed, and wake-ups for long-polls.

Submits create entries; the clock loop resolves them; retrieve_future reads them. Waiters are
plain callables invoked (outside the lock) when an entry completes: the HTTP layer passes
``loop.call_soon_threadsafe(event.set)``, so a long-poll wakes the moment its op finishes,
without sleep-polling. Entries stay until fetched (plus a short grace for a lost response) or
until their TTL; the optional journal records them durably.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loraplex.domain.ops import FutureResult, RequestKind
from loraplex.errors import LoraplexError, NotFoundError, ServerError, UserError
from loraplex.store.futures import FutureJournal

FETCHED_GRACE_S = 120.0
"""A fetched result stays this long so a poll whose response got lost can fetch it again."""


@dataclass
class FutureEntry:
    """One future. ``error`` set means failed; ``is_done`` with no error means succeeded."""

    request_id: str
    tenant: str
    kind: RequestKind
    created_at: float
    is_done: bool = False
    result: FutureResult | None = None
    error: LoraplexError | None = None
    completed_at: float | None = None
    fetched_at: float | None = None
    waiters: list[Callable[[], None]] = field(default_factory=list)


class FutureStore:
    """Thread-safe map of futures shared by every scheduler of the server.

    Args:
        ttl_s: unfetched completed results are dropped this long after completion.
        journal: durable record of request ids and outcomes (optional).
    """

    def __init__(self, ttl_s: float, journal: FutureJournal | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._journal = journal
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, FutureEntry] = {}

    def create(self, request_id: str, tenant: str, kind: RequestKind) -> None:
        with self._lock:
            self._entries[request_id] = FutureEntry(request_id, tenant, kind, self._clock())
        if self._journal is not None:
            self._journal.submitted(request_id, tenant, kind)

    def resolve(self, request_id: str, result: FutureResult) -> None:
        self._complete(request_id, result, None)

    def fail(self, request_id: str, error: LoraplexError) -> None:
        """Fail a future; only the error's message and field are kept (`detached`)."""
        self._complete(request_id, None, error.detached())

    def get(self, request_id: str, tenant: str) -> FutureEntry:
        """The tenant's future. A request id the journal knows but memory lost (restart, TTL)
        comes back as a failed entry; unknown or another tenant's ids raise NotFoundError."""
        with self._lock:
            entry = self._entries.get(request_id)
        if entry is not None and entry.tenant == tenant:
            return entry
        lost = self._journal.find(request_id) if self._journal is not None else None
        if entry is None and lost is not None and lost.tenant == tenant:
            message = lost.error or ("the server restarted (or dropped the result after its TTL)"
                                     " before this request's result was fetched")
            error: LoraplexError = (UserError(message) if lost.category == "user"
                                    else ServerError(message))
            return FutureEntry(request_id, tenant, lost.kind, 0.0, True, None, error)  # type: ignore[arg-type]
        raise NotFoundError(f"request_id: no request {request_id!r}", field="request_id")

    def subscribe(self, request_id: str, notify: Callable[[], None]) -> Callable[[], None]:
        """Call ``notify`` once the future completes (at once if it already has); returns an
        unsubscribe function."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is not None and not entry.is_done:
                entry.waiters.append(notify)
                waiters = entry.waiters
            else:
                waiters = None
        if waiters is None:
            notify()
            return lambda: None

        def unsubscribe() -> None:
            with self._lock:
                if notify in waiters:
                    waiters.remove(notify)

        return unsubscribe

    def mark_fetched(self, request_id: str) -> None:
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is not None and entry.fetched_at is None:
                entry.fetched_at = self._clock()

    def sweep(self) -> int:
        """Drop fetched entries after the grace period and unfetched ones after the TTL."""
        now = self._clock()
        with self._lock:
            stale = [rid for rid, e in self._entries.items() if e.is_done and (
                (e.fetched_at is not None and now - e.fetched_at > FETCHED_GRACE_S)
                or (e.completed_at is not None and now - e.completed_at > self.ttl_s))]
            for rid in stale:
                del self._entries[rid]
        return len(stale)

    def num_pending(self) -> int:
        with self._lock:
            return sum(not e.is_done for e in self._entries.values())

    def _complete(self, request_id: str, result: FutureResult | None,
                  error: LoraplexError | None) -> None:
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.is_done:
                return
            entry.is_done, entry.result, entry.error = True, result, error
            entry.completed_at = self._clock()
            waiters, entry.waiters = entry.waiters, []
        if self._journal is not None:
            self._journal.completed(request_id, None if error is None else error.message,
                                    None if error is None else error.category)
        for notify in waiters:
            notify()
