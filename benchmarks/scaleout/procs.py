"""A `loraplex serve --workers N` process tree as /proc shows it: the server process, the Ray
runtime it started (gcs_server, raylet, Ray's agents and idle workers, all its descendants) and
the engine-worker actors among them, with CPU seconds per process and per role.

Knows nothing of HTTP or of what the processes compute; the scale-out benchmark reads it to
say where CPU time went and to find a worker's pid to kill.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.procs import descendants, stat

#: Ray names an actor's process after its class (``ray::EngineWorker``, and
#: ``ray::EngineWorker.forward_backward`` while a call runs).
ENGINE_WORKER_TITLE = "ray::EngineWorker"
ROLES = ("server", "engine_workers", "ray")


@dataclass(frozen=True)
class Proc:
    """One process: its parent, CPU seconds so far and its title (argv as /proc shows it)."""

    pid: int
    ppid: int
    cpu_s: float
    title: str

    def role(self, root: int) -> str:
        if self.pid == root:
            return "server"
        return "engine_workers" if self.title.startswith(ENGINE_WORKER_TITLE) else "ray"


def _title(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def process_tree(root: int) -> list[Proc]:
    """``root`` and every descendant alive now (root first)."""
    return [Proc(pid, *read, _title(pid)) for pid in descendants(root)
            if (read := stat(pid)) is not None]


def engine_worker_pids(root: int) -> list[int]:
    """The engine-worker actors' pids under a server (live ones, sorted)."""
    return sorted(p.pid for p in process_tree(root) if p.role(root) == "engine_workers")


@dataclass(frozen=True)
class TreeCpu:
    """CPU seconds of every process of a tree at one instant, and each one's role."""

    root: int
    by_pid: dict[int, tuple[str, float]]

    @staticmethod
    def read(root: int) -> TreeCpu:
        return TreeCpu(root, {p.pid: (p.role(root), p.cpu_s) for p in process_tree(root)})

    def since(self, before: TreeCpu) -> dict[str, float]:
        """CPU seconds per role between two readings. A process born in between counts from
        its start; one that died in between is missed (its last seconds are unknowable)."""
        out = dict.fromkeys(ROLES, 0.0)
        for pid, (role, cpu_s) in self.by_pid.items():
            out[role] += cpu_s - before.by_pid.get(pid, (role, 0.0))[1]
        out["total"] = sum(out[r] for r in ROLES)
        return out

    def worker_cpu_s(self, before: TreeCpu) -> dict[int, float]:
        """CPU seconds of each engine worker between two readings."""
        return {pid: cpu_s - before.by_pid.get(pid, (role, 0.0))[1]
                for pid, (role, cpu_s) in self.by_pid.items() if role == "engine_workers"}
