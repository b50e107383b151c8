"""The clock loop on its own thread: a submit wakes it, the future completes, it keeps going
after an engine bug, and it stops cleanly."""

from __future__ import annotations

import threading

from loraplex.scheduler.clock import ClockLoop
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import create, datum, fwd_bwd, make_scheduler


def wait_done(scheduler, item) -> None:  # type: ignore[no-untyped-def]
    done = threading.Event()
    scheduler.futures.subscribe(item.request_id, done.set)
    assert done.wait(10), f"{item.kind} never completed"


def test_submits_wake_the_loop_and_bugs_do_not_stop_it(stores: Stores) -> None:
    toy = ToyExecutor(bug_token=13)
    scheduler = make_scheduler(toy, stores)
    loop = ClockLoop(scheduler, idle_wait_s=60)  # only a wake-up can make progress in time
    loop.start()
    try:
        created = create("m:train:0")
        scheduler.submit(created)
        wait_done(scheduler, created)
        poisoned = fwd_bwd("m:train:0", 1, [datum([13, 2])])
        scheduler.submit(poisoned)
        wait_done(scheduler, poisoned)
        healthy = fwd_bwd("m:train:0", 2)
        scheduler.submit(healthy)
        wait_done(scheduler, healthy)
        assert scheduler.futures.get(healthy.request_id, "alice").error is None
        assert loop.is_alive
    finally:
        loop.stop()
    assert not loop.is_alive
