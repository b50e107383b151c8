"""`Result`: one benchmark run as one record: what ran (name, model, git revision), where
(machine), the machine's state at start and end (load average, GEMM probe), how long, and what
it measured (the payload, the benchmark's own keys).

Every results file is this record as JSON (`to_json` / `from_json`); the payload keeps each
benchmark's keys, so a reader of numbers looks them up under ``payload``. Files written before
the harness hold only a payload; `read_payload` reads either kind.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import REPO

#: Tag of the JSON layout below; a file without it predates the harness (payload only).
SCHEMA = "loraplex-benchmark-result/1"


@dataclass(frozen=True)
class Machine:
    """The CPU a run had: model name, physical cores, hardware threads."""

    cpu: str
    num_cores: int
    num_threads: int

    @classmethod
    def here(cls) -> Machine:
        names, cores = [], set()
        try:
            physical = ""
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "model name":
                    names.append(value)
                elif key == "physical id":
                    physical = value
                elif key == "core id":
                    cores.add((physical, value))
        except OSError:  # not Linux
            pass
        threads = os.cpu_count() or 1
        return cls(names[0] if names else platform.processor() or platform.machine(),
                   len(cores) or threads, threads)

    def __str__(self) -> str:
        return f"{self.cpu}, {self.num_cores} cores, {self.num_threads} threads"


@dataclass(frozen=True)
class Reading:
    """The machine's state at one moment: wall clock, 1/5/15-min load average, and (unless the
    benchmark skips it) the GEMM/copy probe of `benchmarks/probe.py` as its dict."""

    at: str
    load_avg: tuple[float, float, float]
    probe: dict[str, Any] | None = None

    @classmethod
    def now(cls, probe: bool = True) -> Reading:
        """Probe first, then read the load average (the probe's own load is part of it)."""
        measured = None
        if probe:
            from benchmarks.probe import probe_machine

            measured = probe_machine().as_dict()
        one, five, fifteen = (round(x, 2) for x in os.getloadavg())
        return cls(time.strftime("%Y-%m-%d %H:%M:%S"), (one, five, fifteen), measured)


@dataclass(frozen=True)
class Result:
    """One benchmark run (see the module docstring).

    Attributes:
        name: the results file's stem (``engine_train``, ``engine_train_smollm2``).
        model: the model measured, as the benchmark names it ("" when it measures none).
        revision: ``git describe --always --dirty`` of the repo when the run started.
        machine: the CPU it ran on.
        start, end: readings taken before the first and after the last measurement.
        wall_s: seconds from `start` to `end` (to 0.1 s).
        payload: the benchmark's own measurements (JSON-able; its keys are the benchmark's).
    """

    name: str
    model: str
    revision: str
    machine: Machine
    start: Reading
    end: Reading
    wall_s: float
    payload: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "name": self.name, "model": self.model,
                "revision": self.revision, "machine": vars(self.machine),
                "start": _reading_json(self.start), "end": _reading_json(self.end),
                "wall_s": self.wall_s, "payload": self.payload}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        """Raises:
            ValueError: `data` is not a harness result (no or another ``schema``)."""
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} record (schema {data.get('schema')!r})")
        return cls(data["name"], data["model"], data["revision"], Machine(**data["machine"]),
                   _reading(data["start"]), _reading(data["end"]), data["wall_s"],
                   data["payload"])

    @classmethod
    def read(cls, path: Path) -> Result:
        return cls.from_json(json.loads(path.read_text()))

    def provenance(self) -> str:
        """One markdown sentence: when, at which revision, on what, how long, under what load."""
        probe = ""
        if self.start.probe and self.end.probe:
            probe = (f"; GEMM probe (fp32 4096×512→512 forward) "
                     f"{self.start.probe['gemm_gflops']:.1f} → "
                     f"{self.end.probe['gemm_gflops']:.1f} GFLOP/s")
        took = f"{self.wall_s:.0f} s" if self.wall_s < 120 else f"{self.wall_s / 60:.1f} min"
        return (f"Measured {self.start.at} at `{self.revision}` on {self.machine} in {took}; "
                f"load average (1/5/15 min) at start "
                f"{list(self.start.load_avg)}, at end {list(self.end.load_avg)}{probe}.")


class Run:
    """A run in progress: takes the start reading now, the end reading in `finish`.

    Usage::

        run = Run("gguf_parity", probe=False)
        payload = measure(...)
        result = run.finish(payload, model=...)
    """

    def __init__(self, name: str, *, probe: bool = True) -> None:
        self.name, self._probe = name, probe
        self.revision = git_revision()
        self.start = Reading.now(probe)
        self._t0 = time.perf_counter()
        self._end: tuple[Reading, float] | None = None

    def stop(self) -> Reading:
        """Take the end reading now, for a payload computed from it (a roofline from the
        probes); `finish` keeps it."""
        self._end = (Reading.now(self._probe), time.perf_counter())
        return self._end[0]

    def finish(self, payload: dict[str, Any], *, model: str = "", name: str | None = None
               ) -> Result:
        """The record, with the end reading taken now (or at `stop`); ``name`` overrides the
        run's name (a variant chosen by the run's arguments, e.g. ``engine_train_smollm2``)."""
        end, t1 = self._end or (Reading.now(self._probe), time.perf_counter())
        return Result(name or self.name, model, self.revision, Machine.here(), self.start,
                      end, round(t1 - self._t0, 1), payload)


def git_revision(repo: Path = REPO) -> str:
    """Short commit, ``-dirty`` when tracked files differ from it; "unknown" outside git."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=repo,
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip() or "unknown"


def git_state(repo: Path = REPO) -> dict[str, Any]:
    """The commit measured, and whether loraplex/ had uncommitted changes (other work): the
    ``git`` payload key of the load, multiplex, scale-out and side-by-side results."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "loraplex_dirty": bool(git("status", "--porcelain", "--", "loraplex"))}


def read_payload(path: Path) -> dict[str, Any]:
    """A results file's payload: under ``payload`` in a harness record, the whole file in one
    written before the harness."""
    data = json.loads(path.read_text())
    return data["payload"] if data.get("schema") == SCHEMA else data


def _reading_json(reading: Reading) -> dict[str, Any]:
    return {"at": reading.at, "load_avg": list(reading.load_avg), "probe": reading.probe}


def _reading(data: dict[str, Any]) -> Reading:
    one, five, fifteen = data["load_avg"]
    return Reading(data["at"], (one, five, fifteen), data["probe"])
