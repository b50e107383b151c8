"""`LocalWorker`: an `EngineWorker` in a child process of the server, without Ray (the ranks
of ``--model-parallel N`` when no ``--workers`` are asked for).

The child is started with ``spawn`` (a fresh interpreter: no inherited threads or CUDA state),
sets the one-arena host-memory policy before any thread of its own starts, builds the worker
(joining its group) and serves calls read from a pipe: compute calls one at a time on its main
thread (the only thread with an OpenMP team, as in the server), file and bookkeeping calls
(`IO_METHODS`) each on a thread of its own, beside them, as the executor protocol allows.
The parent's `submit` returns a future per call; if the child dies, every pending and later
call fails with `WorkerLostError`. Knows nothing of groups beyond passing `GroupMember` on.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from loraplex.cluster.worker import EngineWorker, GroupMember
from loraplex.config import EngineConfig
from loraplex.errors import WorkerLostError

#: Methods served on threads of their own (the protocol's IO calls, and cheap reads).
IO_METHODS = frozenset({"save_adapter", "read_checkpoint", "adapter_share", "adapter_memory",
                        "noop"})


class LocalWorker:
    """The parent's handle on one child process running an `EngineWorker`.

    Args:
        name: for logs and errors.
        model_dir, config, num_cpus, member: the worker's constructor arguments.
    """

    def __init__(self, name: str, model_dir: str, config: EngineConfig, num_cpus: int,
                 member: GroupMember | None = None) -> None:
        self.name = name
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, name=f"loraplex-{name}", daemon=True,
                                         args=(child, model_dir, config, num_cpus, member))
        self._process.start()
        child.close()
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._lost: str | None = None
        threading.Thread(target=self._read, name=f"loraplex-{name}-reader", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def submit(self, method: str, *args: Any) -> Future[Any]:
        """Call ``method`` in the child; the future holds its value (a `Raised` domain error
        comes back as a value), or `WorkerLostError` when the child died."""
        future: Future[Any] = Future()
        with self._lock:
            if self._lost is not None:
                future.set_exception(WorkerLostError(self._lost))
                return future
            call_id = next(self._ids)
            self._pending[call_id] = future
            try:
                self._conn.send((call_id, method, args))
            except (OSError, ValueError):
                self._fail_all(f"engine worker {self.name} was lost (its pipe closed)")
        return future

    def kill(self) -> None:
        """End the child at once (SIGKILL); pending calls fail."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join(timeout=10)

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, value = self._conn.recv()
            except (EOFError, OSError):
                self._process.join(timeout=5)
                code = self._process.exitcode
                with self._lock:
                    self._fail_all(f"engine worker {self.name} was lost (exit code {code})")
                return
            with self._lock:
                future = self._pending.pop(call_id, None)
            if future is None:
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(RuntimeError(f"engine worker {self.name}: {value}"))

    def _fail_all(self, message: str) -> None:
        """Lock held: the child is gone."""
        self._lost = message
        for future in self._pending.values():
            future.set_exception(WorkerLostError(message))
        self._pending.clear()


def _serve(conn: Connection, model_dir: str, config: EngineConfig, num_cpus: int,
           member: GroupMember | None) -> None:
    """The child: build the worker, then serve calls until the parent goes away."""
    if config.retain_host_memory:  # before any thread of this process allocates
        from loraplex.engine.host_allocator import retain_freed_memory

        retain_freed_memory()
    send_lock = threading.Lock()

    def reply(call_id: int, ok: bool, value: Any) -> None:
        with send_lock:
            conn.send((call_id, ok, value))

    def run(worker: EngineWorker, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            value = getattr(worker, method)(*args)
        except Exception as exc:  # a bug: the parent fails the whole group
            reply(call_id, False, f"{type(exc).__name__}: {exc}")
        else:
            reply(call_id, True, value)

    worker = EngineWorker(model_dir, config, num_cpus, member)
    compute: queue.Queue[tuple[int, str, tuple[Any, ...]] | None] = queue.Queue()

    def receive() -> None:
        while True:
            try:
                call_id, method, args = conn.recv()
            except (EOFError, OSError):
                compute.put(None)
                return
            if method in IO_METHODS:
                threading.Thread(target=run, args=(worker, call_id, method, args),
                                 daemon=True).start()
            else:
                compute.put((call_id, method, args))

    threading.Thread(target=receive, name="loraplex-receive", daemon=True).start()
    while (call := compute.get()) is not None:
        run(worker, *call)
