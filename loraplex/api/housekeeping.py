"""Periodic upkeep on the event loop (store calls run in a worker thread): delete checkpoints
whose TTL passed, expired recorded sequences and stale archives, drop fetched / expired futures,
and release the engine memory of sessions that stopped sending heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import time

from loraplex.api.access import forget_checkpoint, release_session
from loraplex.api.context import ServerContext
from loraplex.store.archive import sweep_archives

log = logging.getLogger("loraplex.api")
ARCHIVE_MAX_AGE_S = 24 * 3600.0


def sweep(ctx: ServerContext) -> None:
    """One round of upkeep (synchronous; also run once at startup)."""
    now = time.time()
    expired = ctx.stores.checkpoints.expire(now)
    for path in expired:
        forget_checkpoint(ctx, path)
    if expired:
        log.info("deleted %d expired checkpoints", len(expired))
    ctx.stores.sequences.expire(now)
    ctx.stores.futures.expire(now - ctx.config.future_ttl_s)
    ctx.futures.sweep()
    sweep_archives(ctx.stores.archive_dir, now - ARCHIVE_MAX_AGE_S)
    for session in ctx.stores.sessions.idle(now - ctx.config.session_idle_timeout_s):
        release_session(ctx, session.session_id)


async def run_forever(ctx: ServerContext) -> None:
    while True:
        await asyncio.sleep(ctx.config.housekeeping_interval_s)
        try:
            await asyncio.to_thread(sweep, ctx)
        except Exception:
            log.exception("housekeeping round failed")
