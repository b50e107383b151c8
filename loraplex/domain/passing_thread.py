"""`in_passing_thread`: run a call on a thread that ends with it, so no OpenMP team outlives it.

Torch-free (the engine and the scheduler's IO workers both use it). The engine computes on one
long-lived thread (the scheduler's clock thread), while other threads (the main thread that
built the engine, IO threads that save checkpoints) also run torch ops now and then. GNU
OpenMP gives every thread that starts a parallel region a team of worker threads that lives
as long as that thread. Once more threads belong to teams than there are CPUs, every team's
workers stop spin-waiting between parallel regions (libgomp's "throttled" spin count, 100
spins) and sleep instead, and each small parallel op then pays a futex wake-up. Measured on
2 cores at 2 threads, SmolLM2: a 32-row decode step took 191 ms on the thread that had loaded
the model and 328 ms on a second thread; ``[32, 1536] * 2.0`` took 10 µs against 74 µs.
A team made on a thread that has ended is freed, so building the model on a passing thread,
and running each IO job on one, leaves the compute thread the only lasting team.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(fn: Callable[[], T], name: str = "loraplex-passing") -> T:
    """``fn()``, run on a new thread that is joined before this returns; its exception is
    re-raised here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
