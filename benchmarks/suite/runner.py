"""Runs manifest entries one after another, never two at once: each as a subprocess in its own
process group, its stdout and stderr into one log file, progress on stdout (entry i/N, the
suite's elapsed time, an estimate of what is left, and every minute the entry's latest log
line). A failed entry is recorded and the next one runs.

Knows nothing of any one benchmark: what to run comes from `manifest.Entry`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks import REPO
from benchmarks.suite.manifest import Entry, available

#: ok: exit 0 and the results file written; failed: a nonzero exit; no_result: exit 0 but the
#: results file not (re)written; missing: this checkout lacks the entry's module (not run);
#: interrupted: stopped by Ctrl-C.
Status = Literal["ok", "failed", "no_result", "missing", "interrupted"]
HEARTBEAT_S = 60.0
#: How long an interrupted entry gets to clean up (its servers) after SIGINT.
STOP_GRACE_S = 60.0
#: Estimated minutes of finished entries before their pace scales the time left.
PACE_AFTER_MIN = 30.0


@dataclass(frozen=True)
class Outcome:
    """What one entry's run came to: ``seconds`` and ``returncode`` None when it did not run,
    ``log`` its log file, or why it did not run."""

    stem: str
    status: Status
    command: str
    estimate_min: float
    seconds: float | None
    returncode: int | None
    log: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ordered(entries: Sequence[Entry]) -> list[Entry]:
    """Quick entries first (by estimated minutes; ties keep manifest order)."""
    return sorted(entries, key=lambda entry: entry.minutes)


def display(entry: Entry, out: Path) -> str:
    """The entry's command as a shell line run from the repo root (``python`` for this
    interpreter)."""
    out = relative(out)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in entry.environment(out).items())
    return (env + " " if env else "") + shlex.join(["python", *entry.argv(out)])


def relative(path: Path) -> Path:
    """`path` relative to the repo root when inside it (entries run there, and a command or
    summary then names no checkout), else absolute."""
    try:
        return path.resolve().relative_to(REPO)
    except ValueError:
        return path.resolve()


def child_env(entry: Entry, out: Path) -> dict[str, str]:
    """This environment, with this checkout first on ``PYTHONPATH`` (servers and workers the
    benchmark starts import this tree's code too), loopback exempt from any proxy (the tinker
    SDK honours proxy variables even for 127.0.0.1), and the entry's own variables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    no_proxy = env.get("NO_PROXY", env.get("no_proxy", ""))
    env["NO_PROXY"] = env["no_proxy"] = ",".join(
        p for p in (no_proxy, "127.0.0.1,localhost") if p)
    return env | entry.environment(out)


def run_entry(entry: Entry, out: Path, log_dir: Path,
              say: Callable[[str], None] = print) -> Outcome:
    """Run `entry` to completion (or Ctrl-C), its output into ``log_dir/<stem>.log``."""
    log = log_dir / f"{entry.stem.replace('/', '_')}.log"
    command = display(entry, out)
    if not available(entry):
        where = f" (on branch {entry.elsewhere})" if entry.elsewhere else ""
        return Outcome(entry.stem, "missing", command, entry.minutes, None, None,
                       f"{entry.module} is not in this checkout{where}")
    result = entry.result_path(out)
    before = result.stat().st_mtime if result.exists() else None
    t0 = time.monotonic()
    with open(log, "wb") as sink:
        sink.write(f"$ {command}\n".encode())
        sink.flush()
        proc = subprocess.Popen([sys.executable, *entry.argv(relative(out))], cwd=REPO,
                                env=child_env(entry, relative(out)), stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait(proc, log, say)
        except KeyboardInterrupt:
            _stop(proc)
            return Outcome(entry.stem, "interrupted", command, entry.minutes,
                           time.monotonic() - t0, proc.returncode, str(relative(log)))
    seconds = time.monotonic() - t0
    written = result.exists() and result.stat().st_mtime != before
    status: Status = ("failed" if proc.returncode != 0 else "ok" if written else "no_result")
    return Outcome(entry.stem, status, command, entry.minutes, seconds, proc.returncode,
                   str(relative(log)))


def run_all(entries: Sequence[Entry], out: Path, log_dir: Path,
            say: Callable[[str], None] = print) -> list[Outcome]:
    """Run `entries` in this order, one at a time, past failures; stop after an interrupted
    one. Returns one `Outcome` per entry started (or found missing)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    runnable = [entry for entry in entries if available(entry)]
    t0 = time.monotonic()
    for i, entry in enumerate(entries):
        left = _left_min([e for e in entries[i:] if e in runnable], outcomes)
        say(f"[{i + 1}/{len(entries)}] {entry.stem} (est. {entry.minutes:g} min; suite "
            f"{_clock(time.monotonic() - t0)} elapsed, ~{_clock(left * 60)} left)")
        say(f"      {display(entry, out)}")
        outcome = run_entry(entry, out, log_dir, say)
        outcomes.append(outcome)
        took = "" if outcome.seconds is None else f" in {duration(outcome.seconds)}"
        code = "" if outcome.returncode in (0, None) else f", exit {outcome.returncode}"
        say(f"      {outcome.status}{took}{code}: {outcome.log}")
        if outcome.status == "interrupted":
            break
    return outcomes


def last_line(log: Path, width: int = 100) -> str:
    """The log's last non-empty line as a terminal would show it (after a progress bar's
    carriage returns), clipped to `width`."""
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        tail = f.read().decode(errors="replace")
    lines = [line.split("\r")[-1].strip() for line in tail.splitlines()]
    shown = next((line for line in reversed(lines) if line), "")
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``1.2 h``."""
    return (f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
            if seconds < 5400 else f"{seconds / 3600:.1f} h")


def _left_min(remaining: Sequence[Entry], done: Sequence[Outcome]) -> float:
    """Minutes the `remaining` entries should take: their estimates × the pace so far (time
    taken ÷ estimated over the entries that ran, once they were estimated at `PACE_AFTER_MIN`
    in all: the quick ones first are too short to tell; 1 before)."""
    ran = [o for o in done if o.seconds is not None]
    estimated = sum(o.estimate_min for o in ran)
    pace = (sum(o.seconds or 0.0 for o in ran) / 60 / estimated
            if estimated >= PACE_AFTER_MIN else 1.0)
    return pace * sum(entry.minutes for entry in remaining)


def _wait(proc: subprocess.Popen[bytes], log: Path, say: Callable[[str], None]) -> None:
    """Wait for `proc` to exit, saying the log's latest line every `HEARTBEAT_S`."""
    t0 = time.monotonic()
    while True:
        try:
            proc.wait(HEARTBEAT_S)
            return
        except subprocess.TimeoutExpired:
            say(f"      {_clock(time.monotonic() - t0)}  {last_line(log)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C the entry's process group (benchmarks stop their servers on it), then SIGKILL
    the group after `STOP_GRACE_S`."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
