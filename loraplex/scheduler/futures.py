"""The future store: request_id → pending | done | failed, and wake-ups for long-polls.

Submits create entries; the clock loop resolves them; retrieve_future reads them. A streamed
sample's entry also collects its new tokens while it runs (`add_progress`, `take_progress`).
Waiters are plain callables invoked (outside the lock) when an entry completes or gains tokens:
the HTTP layer passes ``loop.call_soon_threadsafe(event.set)``, so a long-poll wakes the moment
its op finishes, without sleep-polling. Entries stay until fetched (plus a short grace for a
lost response) or until their TTL; the optional journal records them durably.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import assert_never

from loraplex.domain.ops import (
    CheckpointSaved,
    CustomLossCreated,
    FutureResult,
    ModelCreated,
    RequestKind,
    Sampled,
    SamplerSnapshotReady,
    WeightsLoaded,
)
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.domain.sampling import SequenceDelta
from loraplex.errors import CapacityError, LoraplexError, NotFoundError, ServerError, UserError
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
    size_bytes: int = 0
    waiters: list[Callable[[], None]] = field(default_factory=list)
    progress: list[SequenceDelta] = field(default_factory=list)
    progress_waiters: list[Callable[[], None]] = field(default_factory=list)


class FutureStore:
    """Thread-safe map of futures shared by every scheduler of the server.

    Args:
        ttl_s: unfetched completed results are dropped this long after completion.
        journal: durable record of request ids and outcomes (optional).
        max_unfetched_bytes: per tenant, the completed results (and failures) not fetched yet
            that it may hold; `check_room` refuses new work past it.
    """

    def __init__(self, ttl_s: float, journal: FutureJournal | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 max_unfetched_bytes: int | None = None) -> None:
        self.ttl_s = ttl_s
        self.max_unfetched_bytes = max_unfetched_bytes
        self._journal = journal
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, FutureEntry] = {}
        self._unfetched: Counter[str] = Counter()

    def unfetched_bytes(self, tenant: str) -> int:
        """Bytes of the tenant's completed results (and failures) nobody fetched yet."""
        with self._lock:
            return self._unfetched[tenant]

    def check_room(self, tenant: str) -> None:
        """Raises CapacityError (HTTP 429) while the tenant is at its unfetched-result quota."""
        if self.max_unfetched_bytes is None:
            return
        held = self.unfetched_bytes(tenant)
        if held >= self.max_unfetched_bytes:
            raise CapacityError(f"tenant holds {held} bytes of results it has not fetched "
                                f"(quota {self.max_unfetched_bytes}): fetch them with "
                                "retrieve_future, or wait for them to expire")

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

    def subscribe(self, request_id: str, notify: Callable[[], None],
                  progress: bool = False) -> Callable[[], None]:
        """Call ``notify`` once the future completes (at once if it already has) and, with
        ``progress``, whenever it gains streamed tokens (at once if it holds some); returns an
        unsubscribe function."""
        with self._lock:
            entry = self._entries.get(request_id)
            lists = []
            if entry is not None and not entry.is_done:
                lists.append(entry.waiters)
                if progress:
                    lists.append(entry.progress_waiters)
                for waiters in lists:
                    waiters.append(notify)
            now = entry is None or entry.is_done or (progress and bool(entry.progress))
        if now:
            notify()

        def unsubscribe() -> None:
            with self._lock:
                for waiters in lists:
                    if notify in waiters:
                        waiters.remove(notify)

        return unsubscribe

    def add_progress(self, deltas: Sequence[SequenceDelta]) -> None:
        """New tokens of streamed samples that still run: kept on their futures until
        `take_progress`; their progress waiters are woken (and stay subscribed)."""
        if not deltas:
            return
        woken: list[Callable[[], None]] = []
        with self._lock:
            for delta in deltas:
                entry = self._entries.get(delta.request_id)
                if entry is not None and not entry.is_done:
                    entry.progress.append(delta)
                    woken += entry.progress_waiters
        for notify in dict.fromkeys(woken):
            notify()

    def take_progress(self, request_id: str, tenant: str) -> list[SequenceDelta]:
        """The tokens the tenant's streamed sample gained since the last call (none once it is
        done: its result holds them all)."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.tenant != tenant:
                return []
            taken, entry.progress = entry.progress, []
            return taken

    def mark_fetched(self, request_id: str) -> None:
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is not None and entry.fetched_at is None:
                entry.fetched_at = self._clock()
                self._release(entry)

    def sweep(self) -> int:
        """Drop fetched entries after the grace period and unfetched ones after the TTL."""
        now = self._clock()
        with self._lock:
            stale = [rid for rid, e in self._entries.items() if e.is_done and (
                (e.fetched_at is not None and now - e.fetched_at > FETCHED_GRACE_S)
                or (e.completed_at is not None and now - e.completed_at > self.ttl_s))]
            for rid in stale:
                self._release(self._entries.pop(rid))
        return len(stale)

    def _release(self, entry: FutureEntry) -> None:
        """Stop counting ``entry`` against its tenant's unfetched bytes (lock held)."""
        if entry.size_bytes:
            self._unfetched[entry.tenant] -= entry.size_bytes
            if self._unfetched[entry.tenant] <= 0:
                del self._unfetched[entry.tenant]
            entry.size_bytes = 0

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
            entry.progress, entry.progress_waiters = [], []
            entry.completed_at = self._clock()
            entry.size_bytes = (len(error.message) if error is not None
                                else result_nbytes(result))
            self._unfetched[entry.tenant] += entry.size_bytes
            waiters, entry.waiters = entry.waiters, []
        if self._journal is not None:
            self._journal.completed(request_id, None if error is None else error.message,
                                    None if error is None else error.category)
        for notify in waiters:
            notify()


def result_nbytes(result: FutureResult | None) -> int:
    """About how many bytes a completed result holds (its arrays; a small record otherwise)."""
    match result:
        case ForwardBackwardResult():
            return 4 * sum(len(a) for a in (*result.logprobs, *result.elementwise_loss)) + 256
        case Sampled():
            sequences = result.result.sequences
            topk = sum(4 * len(s.topk_logprobs.token_ids) * 2 for s in sequences
                       if s.topk_logprobs is not None)
            return 8 * sum(len(s.tokens) for s in sequences) + topk + 256
        case (ModelCreated() | WeightsLoaded() | CheckpointSaved() | SamplerSnapshotReady()
              | OptimStepResult() | CustomLossCreated() | None):
            return 256
        case _:
            assert_never(result)
