"""The multiplex benchmark's tenant processes and CPU accounting: a pool of long-lived
`multiplex/tenant.py` workers (one OS process per tenant), their JSON-line events, and CPU
seconds read from /proc for any set of processes and for the whole machine.

Knows nothing about servers or metrics; `benchmarks/multiplex/` drives it.
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

TENANT_SCRIPT = Path(__file__).resolve().parent / "tenant.py"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


@dataclass(frozen=True)
class Event:
    """One line a worker wrote: which worker, when it was read, what it said."""

    worker: int
    received: float
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("event"))


class TenantPool:
    """``size`` tenant worker processes, started at once and kept for every run.

    Args:
        size: number of workers (the largest K).
        log_dir: each worker's stderr goes to ``tenant-<i>.log`` here.
        python: the interpreter (its installed ``tinker`` is the SDK the tenants use).
    """

    def __init__(self, size: int, log_dir: Path, python: str = sys.executable) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                   TINKER_TELEMETRY="0", PYTHONUNBUFFERED="1")
        self.events: queue.Queue[Event] = queue.Queue()
        self._procs: list[subprocess.Popen[str]] = []
        self._logs: list[IO[bytes]] = []
        for i in range(size):
            log = open(log_dir / f"tenant-{i}.log", "ab")  # noqa: SIM115 (closed in close())
            proc = subprocess.Popen([python, str(TENANT_SCRIPT)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, text=True, env=env)
            self._logs.append(log)
            self._procs.append(proc)
            threading.Thread(target=self._read, args=(i, proc), daemon=True).start()
        self.wait_all(range(size), "started", timeout_s=600.0)

    def _read(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                self.events.put(Event(index, time.time(), json.loads(line)))
        self.events.put(Event(index, time.time(), {"event": "exited"}))

    def __len__(self) -> int:
        return len(self._procs)

    def pid(self, index: int) -> int:
        return self._procs[index].pid

    def send(self, index: int, message: dict[str, Any]) -> None:
        stdin = self._procs[index].stdin
        assert stdin is not None
        stdin.write(json.dumps(message) + "\n")
        stdin.flush()

    def next_event(self, timeout_s: float) -> Event:
        """The next event of any worker; a worker's error or exit raises RuntimeError.

        Raises:
            RuntimeError: a worker reported an error or exited.
            queue.Empty: nothing arrived within ``timeout_s``.
        """
        event = self.events.get(timeout=timeout_s)
        if event.kind in ("error", "exited"):
            raise RuntimeError(f"tenant worker {event.worker}: {event.body}")
        return event

    def wait_all(self, workers: Iterable[int], kind: str, timeout_s: float) -> dict[int, Event]:
        """Until every worker in ``workers`` has sent a ``kind`` event (others are dropped)."""
        waiting, got = set(workers), {}
        deadline = time.monotonic() + timeout_s
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"workers {sorted(waiting)} sent no {kind!r} in {timeout_s} s")
            event = self.next_event(left)
            if event.kind == kind and event.worker in waiting:
                waiting.discard(event.worker)
                got[event.worker] = event
        return got

    def cpu_s(self, workers: Iterable[int]) -> float:
        return sum(process_cpu_s(self.pid(i)) for i in workers)

    def close(self) -> None:
        for i, proc in enumerate(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(OSError):  # its stdin is already closed
                    self.send(i, {"exit": True})
        for proc in self._procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in self._logs:
            log.close()
