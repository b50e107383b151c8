"""Where a scheduler's file work runs: checkpoint saves (write, encrypt, commit) and checkpoint
reads (for ``load_weights`` and for samplers of a checkpoint), off the clock thread, so one
tenant's export never stalls other tenants' cycles.

`ThreadedIo` runs jobs on a small pool of daemon threads (the server's choice); `InlineIo` runs
each job at once in the caller's thread, after the scheduler released its lock (synchronous
tests and benchmarks that drive ``plan``/``complete`` by hand). Jobs report back to the
scheduler themselves; a job that raises is a bug, logged and otherwise ignored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from loraplex.domain.passing_thread import in_passing_thread

log = logging.getLogger("loraplex.scheduler")

Job = Callable[[], None]


class IoWorkers(Protocol):
    def submit(self, job: Job) -> None: ...

    def close(self) -> None:
        """Wait for the jobs already submitted (a save in progress is never cut off)."""
        ...


class ThreadedIo:
    """A pool of ``num_threads`` IO threads; each job runs on a thread of its own that ends
    with it. An OpenMP team that a job's tensor ops start (a save's copies) then dies with
    the job, instead of living on in a pool thread beside the compute thread's team: with more
    threads in teams than CPUs, GNU OpenMP makes every team sleep between parallel regions,
    and small ops on the compute thread slow several-fold (`domain.passing_thread`)."""

    def __init__(self, num_threads: int, name: str = "loraplex-io") -> None:
        self._pool = ThreadPoolExecutor(max(1, num_threads), thread_name_prefix=name)
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("IO workers are closed")
            future = self._pool.submit(in_passing_thread, job, "loraplex-io-job")
            future.add_done_callback(_log_failure)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)


class InlineIo:
    """Runs each job at once, in the thread that submits it."""

    def submit(self, job: Job) -> None:
        try:
            job()
        except Exception:
            log.exception("IO job failed")

    def close(self) -> None:
        return None


def _log_failure(done: Future[None]) -> None:
    exc = done.exception()
    if exc is not None:
        log.error("IO job failed", exc_info=exc)
