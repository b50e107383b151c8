"""The load benchmark's worker processes (`client.py`, `flood.py`, `openai_clients.py`):
spawn them, send them JSON lines, read their events from one queue, and hand every event read to a
sink, so a wait for one kind of event never drops another worker's ops.

Knows the workers' line protocol (``started``, ``error``, their exit), not what they measure.
Every event a wait is for comes once per worker, so a worker that sent it before the wait began
(read by an earlier pump) counts as done.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.multiplex.pool import process_cpu_s

HERE = Path(__file__).resolve().parent
CLIENT_SCRIPT = HERE / "client.py"
FLOOD_SCRIPT = HERE / "flood.py"
OPENAI_SCRIPT = HERE / "openai_clients.py"


@dataclass(frozen=True)
class Event:
    """One line a worker wrote (or ``exited`` when its stdout closed)."""

    worker: str
    received: float
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("event"))


class Workers:
    """Named worker processes; ``sink`` sees every event read, in order.

    Args:
        log_dir: each worker's stderr goes to ``<name>.log`` here.
        sink: called with each event `next_event` returns.
    """

    def __init__(self, log_dir: Path, sink: Callable[[Event], None]) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir, self.sink = log_dir, sink
        self.events: queue.Queue[Event] = queue.Queue()
        self._procs: dict[str, subprocess.Popen[str]] = {}
        self._logs: list[IO[bytes]] = []
        self._may_exit: set[str] = set()
        self._last: dict[tuple[str, str], Event] = {}  # (worker, kind) → its latest event

    def spawn(self, name: str, script: Path) -> None:
        env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                   TINKER_TELEMETRY="0", PYTHONUNBUFFERED="1")
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (closed in close())
        proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        self._logs.append(log)
        self._procs[name] = proc
        threading.Thread(target=self._read, args=(name, proc), daemon=True).start()

    def _read(self, name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                self.events.put(Event(name, time.time(), json.loads(line)))
        self.events.put(Event(name, time.time(), {"event": "exited"}))

    def pid(self, name: str) -> int:
        return self._procs[name].pid

    def send(self, name: str, message: dict[str, Any]) -> None:
        stdin = self._procs[name].stdin
        assert stdin is not None
        stdin.write(json.dumps(message) + "\n")
        stdin.flush()

    def may_exit(self, name: str) -> None:
        """From now on ``name`` exiting is expected (it was told to stop)."""
        self._may_exit.add(name)

    def stop(self, names: Iterable[str], kind: str, timeout_s: float) -> dict[str, Event]:
        """Tell ``names`` to stop (their exit is expected from now on) and wait until each
        has sent its ``kind`` event."""
        names = list(names)
        for name in names:
            self.may_exit(name)
            self.send(name, {"stop": True})
        return self.wait_all(names, kind, timeout_s)

    def next_event(self, timeout_s: float) -> Event:
        """The next event of any worker, after the sink saw it.

        Raises:
            RuntimeError: a worker reported an error, or exited when not told to stop.
            queue.Empty: nothing arrived within ``timeout_s``.
        """
        event = self.events.get(timeout=max(0.0, timeout_s))
        self._last[event.worker, event.kind] = event
        self.sink(event)
        if event.kind == "error" or (event.kind == "exited" and event.worker not in
                                     self._may_exit):
            raise RuntimeError(f"load worker {event.worker}: {event.body}; log "
                               f"{self.log_dir / event.worker}.log:\n{self.log_tail(event.worker)}")
        return event

    def pump(self, until: float) -> None:
        """Read events (into the sink) until the wall clock reaches ``until``."""
        while (left := until - time.time()) > 0:
            with contextlib.suppress(queue.Empty):
                self.next_event(min(left, 0.25))

    def wait_all(self, names: Iterable[str], kind: str, timeout_s: float) -> dict[str, Event]:
        """Until every worker in ``names`` has sent its ``kind`` event (also if an earlier pump
        read it)."""
        names = list(names)
        got = {n: self._last[n, kind] for n in names if (n, kind) in self._last}
        waiting = set(names) - set(got)
        deadline = time.time() + timeout_s
        while waiting:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError(f"workers {sorted(waiting)} sent no {kind!r} in {timeout_s} s")
            with contextlib.suppress(queue.Empty):
                event = self.next_event(min(left, 0.25))
                if event.kind == kind and event.worker in waiting:
                    waiting.discard(event.worker)
                    got[event.worker] = event
        return got

    def cpu_s(self, names: Iterable[str]) -> float:
        return sum(process_cpu_s(self.pid(n)) for n in names)

    def log_tail(self, name: str, num_lines: int = 20) -> str:
        try:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    def close(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):  # its stdin is already closed
                    assert proc.stdin is not None
                    proc.stdin.close()
        for proc in self._procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for log in self._logs:
            log.close()
