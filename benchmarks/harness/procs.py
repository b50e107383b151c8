"""What /proc says about processes a benchmark watches: CPU seconds of a process and of the
whole machine, a process and its descendants, their resident memory.

Reads /proc only (Linux); knows nothing of what the processes are.
"""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds of all its threads) of a live process; None once
    it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far; 0 once it is gone."""
    read = stat(pid)
    return 0.0 if read is None else read[1]


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    """``pid`` and its descendants, breadth first, each one's children in pid order (from
    /proc/<pid>/task/*/children: a child of any thread counts)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        out.append(current)
        children: set[int] = set()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children.update(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
        todo += sorted(children)
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (VmRSS); 0 once it is gone."""
    total = 0
    for member in descendants(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
