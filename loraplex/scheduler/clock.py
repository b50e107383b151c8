"""The clock loop: one dedicated thread per executor running plan → engine call → complete;
it stops when the executor's worker is lost and hands the scheduler to ``on_lost``.

Engine calls block (torch), so they never run on the HTTP event loop. The thread sleeps on the
scheduler's condition variable when there is nothing to do and is woken by every submit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from loraplex.errors import WorkerLostError
from loraplex.scheduler.runner import run_plan
from loraplex.scheduler.scheduler import Scheduler

log = logging.getLogger("loraplex.scheduler")


class ClockLoop:
    """Drives one scheduler on its own thread.

    Args:
        scheduler: the state machine to drive (its executor is called from this thread only).
        idle_wait_s: longest sleep while idle (a wake-up normally comes first); each
            ``idle_wait_s`` without a plan ends with ``executor.release_memory()`` (never
            between back-to-back plans, where kept memory saves the next step's page faults).
            That call is also the idle worker's liveness check: a worker found dead by it is
            lost at once (its runs move, a replacement starts), not when an op next needs it.
        on_lost: called on this thread, after the loop stopped, when the scheduler's worker
            was lost (None: the loop just stops).
    """

    def __init__(self, scheduler: Scheduler, name: str = "loraplex-clock",
                 idle_wait_s: float = 1.0,
                 on_lost: Callable[[Scheduler], None] | None = None) -> None:
        self.scheduler = scheduler
        self.idle_wait_s = idle_wait_s
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current plan; saves still writing on IO threads finish first."""
        self._stop.set()
        self.scheduler.wake()
        if self._thread.ident is not None:  # never started: nothing to wait for
            self._thread.join(timeout)
        self.scheduler.close()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _release_memory(self) -> None:
        try:
            self.scheduler.executor.release_memory()
        except WorkerLostError as exc:  # found dead while idle
            self.scheduler.mark_lost(exc)

    def _run(self) -> None:
        busy_at = time.monotonic()  # the last plan's end, or the last memory release
        while not self._stop.is_set() and self.scheduler.lost is None:
            try:
                plan = self.scheduler.wait_for_plan(self.idle_wait_s)
                if plan is None:
                    if time.monotonic() - busy_at >= self.idle_wait_s:
                        busy_at = time.monotonic()  # idle a while: memory back to the OS
                        self._release_memory()
                    continue
                outcome = run_plan(self.scheduler.executor, plan)
                self.scheduler.complete(plan, outcome)
                busy_at = time.monotonic()
            except Exception:  # never let a bookkeeping bug stop the server's only worker
                log.exception("clock loop step failed; continuing")
        if self.scheduler.lost is not None and self._on_lost is not None:
            try:
                self._on_lost(self.scheduler)
            except Exception:
                log.exception("moving a lost worker's runs failed")
