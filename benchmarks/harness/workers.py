"""Worker processes a benchmark drives over JSON lines (the load benchmark's clients, the
multiplex and scale-out tenants): spawn them, send them commands on stdin, read their events
from one queue, and hand every event read to a sink, so a wait for one kind of event never
drops another worker's.

Knows the workers' line protocol (``started``, ``error``, their exit), not what they measure.
A wait takes the next event of its kind from each worker: one a worker sent before the wait
began (read by an earlier pump) counts, and is taken by that wait only.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.harness.procs import process_cpu_s


@dataclass(frozen=True)
class Event:
    """One line a worker wrote (or ``exited`` when its stdout closed)."""

    worker: Hashable
    received: float
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("event"))


class Workers:
    """Worker processes by name; ``sink`` sees every event read, in order.

    Args:
        log_dir: each worker's stderr goes to ``<log_prefix><name>.log`` here.
        sink: called with each event `next_event` returns.
        log_prefix: see ``log_dir``.
    """

    def __init__(self, log_dir: Path, sink: Callable[[Event], None] = lambda _: None,
                 log_prefix: str = "") -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir, self.sink, self.log_prefix = log_dir, sink, log_prefix
        self.events: queue.Queue[Event] = queue.Queue()
        self._procs: dict[Hashable, subprocess.Popen[str]] = {}
        self._logs: list[IO[bytes]] = []
        self._may_exit: set[Hashable] = set()
        self._unwaited: dict[tuple[Hashable, str], Event] = {}  # (worker, kind) → latest event

    def spawn(self, name: Hashable, script: Path, python: str = sys.executable) -> None:
        """Start ``python script`` as worker ``name`` (``python``'s installed ``tinker`` is
        the SDK it uses)."""
        env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                   TINKER_TELEMETRY="0", PYTHONUNBUFFERED="1")
        log = open(self._log_path(name), "ab")  # noqa: SIM115 (closed in close())
        proc = subprocess.Popen([python, str(script)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        self._logs.append(log)
        self._procs[name] = proc
        threading.Thread(target=self._read, args=(name, proc), daemon=True).start()

    def _log_path(self, name: Hashable) -> Path:
        return self.log_dir / f"{self.log_prefix}{name}.log"

    def _read(self, name: Hashable, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                self.events.put(Event(name, time.time(), json.loads(line)))
        self.events.put(Event(name, time.time(), {"event": "exited"}))

    def __len__(self) -> int:
        return len(self._procs)

    def pid(self, name: Hashable) -> int:
        return self._procs[name].pid

    def send(self, name: Hashable, message: dict[str, Any]) -> None:
        stdin = self._procs[name].stdin
        assert stdin is not None
        stdin.write(json.dumps(message) + "\n")
        stdin.flush()

    def stop(self, names: Iterable[Hashable], kind: str, timeout_s: float
             ) -> dict[Hashable, Event]:
        """Tell ``names`` to stop (their exit is expected from now on) and wait until each
        has sent its ``kind`` event."""
        names = list(names)
        for name in names:
            self._may_exit.add(name)
            self.send(name, {"stop": True})
        return self.wait_all(names, kind, timeout_s)

    def next_event(self, timeout_s: float) -> Event:
        """The next event of any worker, after the sink saw it.

        Raises:
            RuntimeError: a worker reported an error, or exited when not told to stop.
            queue.Empty: nothing arrived within ``timeout_s``.
        """
        event = self.events.get(timeout=max(0.0, timeout_s))
        self._unwaited[event.worker, event.kind] = event
        self.sink(event)
        if event.kind == "error" or (event.kind == "exited" and event.worker not in
                                     self._may_exit):
            raise RuntimeError(f"worker {event.worker}: {event.body}; log "
                               f"{self._log_path(event.worker)}:\n{self.log_tail(event.worker)}")
        return event

    def pump(self, until: float) -> None:
        """Read events (into the sink) until the wall clock reaches ``until``."""
        while (left := until - time.time()) > 0:
            with contextlib.suppress(queue.Empty):
                self.next_event(min(left, 0.25))

    def wait_all(self, names: Iterable[Hashable], kind: str, timeout_s: float
                 ) -> dict[Hashable, Event]:
        """Until every worker in ``names`` has sent a ``kind`` event (also if an earlier pump
        read it); each such event is taken by this wait."""
        waiting, got = set(names), {}
        deadline = time.time() + timeout_s
        while True:
            for name in [n for n in waiting if (n, kind) in self._unwaited]:
                got[name] = self._unwaited.pop((name, kind))
                waiting.discard(name)
            if not waiting:
                return got
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError(f"workers {sorted(map(str, waiting))} sent no {kind!r} in "
                                   f"{timeout_s} s")
            with contextlib.suppress(queue.Empty):
                self.next_event(min(left, 0.25))

    def cpu_s(self, names: Iterable[Hashable]) -> float:
        return sum(process_cpu_s(self.pid(n)) for n in names)

    def log_tail(self, name: Hashable, num_lines: int = 20) -> str:
        try:
            lines = self._log_path(name).read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    def close(self) -> None:
        """Close every worker's stdin (a worker exits at its end) and wait for it (killed
        after 30 s)."""
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):  # its stdin is already closed
                    assert proc.stdin is not None
                    proc.stdin.close()
        for proc in self._procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for log in self._logs:
            log.close()
