"""Completion feeds for ``/api/v1/retrieve_futures`` (flag ``sample_use_retrieve_futures``): per
(tenant, sampling session, cloned sampler) an ordered log of its samples' completions, so one
long-poll per SamplingClient replaces one ``retrieve_future`` long-poll per in-flight sample.

``asample`` `watch`es each request of a session; the future store calls back (on the clock
thread) when it completes and the event is appended under a cursor that only grows. A poll
with ``prev_cursor`` acknowledges (drops) the events up to it and answers those after it,
waiting up to its timeout when there are none. Held by the app (``app.state``); knows nothing
of HTTP or of what the futures hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Literal

from loraplex.api.responses.sampling_sessions import FutureCompletion
from loraplex.errors import LoraplexError
from loraplex.scheduler.futures import FutureStore

FeedKey = tuple[str, str, int]
"""(tenant, sampling_session_id, cloned_sampler_id)."""

MAX_FEEDS = 100_000
"""Most feeds kept; the least recently polled one is dropped past it (its client then falls
back to nothing: a client only polls its own feed, so this bounds memory, not correctness,
for the clients that are active)."""


@dataclass
class _Feed:
    events: list[tuple[int, FutureCompletion]] = field(default_factory=list)
    cursor: int = 0
    watched: set[str] = field(default_factory=set)
    wakeups: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)


class CompletionFeeds:
    """Every sampling session's completion log (thread-safe)."""

    def __init__(self, futures: FutureStore) -> None:
        self._futures = futures
        self._lock = threading.Lock()
        self._feeds: dict[FeedKey, _Feed] = {}

    def watch(self, key: FeedKey, request_id: str) -> None:
        """Log ``request_id``'s completion in ``key``'s feed (once, however often asked)."""
        with self._lock:
            feed = self._feed(key)
            if request_id in feed.watched:
                return
            feed.watched.add(request_id)
        self._futures.subscribe(request_id, lambda: self._completed(key, request_id))

    def _completed(self, key: FeedKey, request_id: str) -> None:
        state: Literal["finished", "failed"]
        try:
            state = "failed" if self._futures.get(request_id, key[0]).error else "finished"
        except LoraplexError:  # expired before it was seen: its retrieve_future says so
            state = "failed"
        event = FutureCompletion(state=state, request_id=request_id)
        if state == "finished":  # set, so sent (as null)
            event.response_payload_uncompressed_size = None
        with self._lock:
            feed = self._feed(key)
            feed.watched.discard(request_id)
            feed.cursor += 1
            feed.events.append((feed.cursor, event))
            wakeups, feed.wakeups = feed.wakeups, []
        for loop, woken in wakeups:
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                loop.call_soon_threadsafe(woken.set)

    async def poll(self, key: FeedKey, prev_cursor: int, timeout_s: float
                   ) -> tuple[list[FutureCompletion], int]:
        """Acknowledge the events up to ``prev_cursor``; the events after it (waiting up to
        ``timeout_s`` for one) and the cursor to send next."""
        woken = asyncio.Event()
        with self._lock:
            feed = self._feed(key)
            feed.events = [(c, e) for c, e in feed.events if c > prev_cursor]
            must_wait = not feed.events and timeout_s > 0
            if must_wait:
                feed.wakeups.append((asyncio.get_running_loop(), woken))
        if must_wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout_s)
        with self._lock:
            feed = self._feed(key)
            feed.wakeups = [w for w in feed.wakeups if w[1] is not woken]
            fresh = [e for c, e in feed.events if c > prev_cursor]
            return fresh, max(feed.cursor if fresh else prev_cursor, prev_cursor)

    def _feed(self, key: FeedKey) -> _Feed:
        feed = self._feeds.pop(key, None) or _Feed()
        self._feeds[key] = feed  # most recently used last
        while len(self._feeds) > MAX_FEEDS:
            self._feeds.pop(next(iter(self._feeds)))
        return feed
