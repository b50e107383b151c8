"""Long-polling a future without sleep-polling: wait on an asyncio event that the clock thread
sets through ``loop.call_soon_threadsafe`` when the future completes, up to a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib

from loraplex.scheduler.futures import FutureStore


async def wait_until_done(futures: FutureStore, request_id: str, timeout_s: float) -> None:
    """Return when the future completes or ``timeout_s`` passes, whichever is first."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            loop.call_soon_threadsafe(done.set)

    unsubscribe = futures.subscribe(request_id, notify)
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError:
        pass
    finally:
        unsubscribe()
