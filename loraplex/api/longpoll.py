"""Long-polling futures without sleep-polling: wait on an asyncio event that the clock thread
sets through ``loop.call_soon_threadsafe`` when a future completes (or a streamed sample gains
tokens), up to a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from loraplex.scheduler.futures import FutureStore


async def wait_until_done(futures: FutureStore, request_id: str, timeout_s: float) -> None:
    """Return when the future completes or ``timeout_s`` passes, whichever is first."""
    await wait_for_news(futures, [request_id], timeout_s, progress=False)


async def wait_for_news(futures: FutureStore, request_ids: Sequence[str], timeout_s: float,
                        progress: bool = True) -> None:
    """Return when one of the futures completes or (with ``progress``) gains streamed tokens
    (at once if one already has), or when ``timeout_s`` passes."""
    loop = asyncio.get_running_loop()
    news = asyncio.Event()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            loop.call_soon_threadsafe(news.set)

    unsubscribes = [futures.subscribe(rid, notify, progress) for rid in request_ids]
    try:
        await asyncio.wait_for(news.wait(), timeout_s)
    except TimeoutError:
        pass
    finally:
        for unsubscribe in unsubscribes:
            unsubscribe()
