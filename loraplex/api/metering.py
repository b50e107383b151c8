"""The usage meter: folds the schedulers' metered ops into the SQLite usage table, and their
logged training metrics into the run-metrics store.

Runs on the event loop every ``metering.flush_interval_s`` (the SQLite write in a worker
thread), once more at shutdown after the clock loops stopped, and on demand before the usage
endpoint (and the dashboard's metrics endpoint) answers, so a client always sees its finished
ops. The clock thread never writes.
"""

from __future__ import annotations

import asyncio
import logging

from loraplex.api.context import ServerContext
from loraplex.scheduler.usage import usage_deltas

log = logging.getLogger("loraplex.api")


def flush(ctx: ServerContext) -> int:
    """Move every metered op into the usage store and every logged training-metrics point into
    the run-metrics store; returns how many ops were folded."""
    drained = [(scheduler, scheduler.usage.drain_ops()) for scheduler in ctx.catalog.schedulers()]
    try:
        ctx.stores.usage.add(usage_deltas(op for _, ops in drained for op in ops))
    except BaseException:
        for scheduler, ops in drained:  # keep them for the next flush
            scheduler.usage.add(ops)
        raise
    flush_steps(ctx)
    return sum(len(ops) for _, ops in drained)


def flush_steps(ctx: ServerContext) -> int:
    """Move every logged training-metrics point into the run-metrics store; returns how many
    (each scheduler's in log order, even when the meter and a request flush at once)."""
    return sum(scheduler.steps.drain_into(ctx.stores.run_metrics.add)
               for scheduler in ctx.catalog.schedulers())


async def run_forever(ctx: ServerContext) -> None:
    while True:
        await asyncio.sleep(ctx.config.metering.flush_interval_s)
        try:
            await asyncio.to_thread(flush, ctx)
        except Exception:
            log.exception("usage flush failed")
