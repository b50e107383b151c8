"""The clock loop: one dedicated thread per executor running plan → engine call → complete.

Engine calls block (torch), so they never run on the HTTP event loop. The thread sleeps on the
scheduler's condition variable when there is nothing to do and is woken by every submit.
"""

from __future__ import annotations

import logging
import threading

from loraplex.scheduler.runner import run_plan
from loraplex.scheduler.scheduler import Scheduler

log = logging.getLogger("loraplex.scheduler")


class ClockLoop:
    """Drives one scheduler on its own thread.

    Args:
        scheduler: the state machine to drive (its executor is called from this thread only).
        idle_wait_s: longest sleep while idle (a wake-up normally comes first).
    """

    def __init__(self, scheduler: Scheduler, name: str = "loraplex-clock",
                 idle_wait_s: float = 1.0) -> None:
        self.scheduler = scheduler
        self.idle_wait_s = idle_wait_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current plan; saves still writing on IO threads finish first."""
        self._stop.set()
        self.scheduler.wake()
        self._thread.join(timeout)
        self.scheduler.close()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                plan = self.scheduler.wait_for_plan(self.idle_wait_s)
                if plan is None:
                    continue
                outcome = run_plan(self.scheduler.executor, plan)
                self.scheduler.complete(plan, outcome)
            except Exception:  # never let a bookkeeping bug stop the server's only worker
                log.exception("clock loop step failed; continuing")
