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


def test_memory_is_released_while_idle_and_not_between_plans(stores: Stores) -> None:
    """`release_memory` comes after ``idle_wait_s`` without a plan, not after each plan."""
    toy = ToyExecutor()
    scheduler = make_scheduler(toy, stores)
    loop = ClockLoop(scheduler, idle_wait_s=60)  # never idle that long here
    loop.start()
    try:
        for step in range(3):
            item = create("m:train:0") if step == 0 else fwd_bwd("m:train:0", step)
            scheduler.submit(item)
            wait_done(scheduler, item)
        assert toy.memory_releases == 0
    finally:
        loop.stop()
    idle = ToyExecutor()
    loop = ClockLoop(make_scheduler(idle, stores), idle_wait_s=0.05)
    loop.start()
    try:
        pause = threading.Event()
        for _ in range(100):  # up to 5 s
            if idle.memory_releases >= 2:
                break
            pause.wait(0.05)
        assert idle.memory_releases >= 2
    finally:
        loop.stop()
