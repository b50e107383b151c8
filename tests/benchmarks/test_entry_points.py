"""Every benchmark entry point answers ``--help`` both as a script (`python benchmarks/X.py`) and
as a module (`python -m benchmarks.X`), from the repo root, with no PYTHONPATH.

Entry points are found, not listed: any file under benchmarks/ with a ``__main__`` block, so a new
benchmark is checked without touching this test; ``python -m benchmarks NAME`` dispatches to
them (`benchmarks/__main__.py`). All runs start at once (most of their time is
importing torch or the SDK), so the whole check costs about one slow import per core.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
# Runs in SkyRL's own venv (it imports `skyrl`), not in ours: a launcher, not a benchmark.
NOT_OURS = {BENCHMARKS / "peers" / "skyrl_compat" / "run_api.py"}


def _entry_points() -> list[Path]:
    return sorted(path for path in BENCHMARKS.rglob("*.py")
                  if "results" not in path.relative_to(BENCHMARKS).parts
                  and path not in NOT_OURS
                  and 'if __name__ == "__main__":' in path.read_text())


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__main__" else parts)


def _invocations() -> dict[str, list[str]]:
    runs: dict[str, list[str]] = {}
    for path in _entry_points():
        module = _module_name(path)
        runs[f"script:{path.relative_to(REPO)}"] = [str(path.relative_to(REPO))]
        runs[f"module:{module}"] = ["-m", module]
    return runs


INVOCATIONS = _invocations()


@pytest.fixture(scope="module")
def help_runs() -> dict[str, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    procs = {name: subprocess.Popen([sys.executable, *args, "--help"], cwd=REPO, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, args in INVOCATIONS.items()}
    runs = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        runs[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return runs


def test_entry_points_are_found() -> None:
    names = {_module_name(path) for path in _entry_points()}
    assert {"benchmarks.engine_train", "benchmarks.engine_sample", "benchmarks.multiplex",
            "benchmarks.server_overhead", "benchmarks.scheduler_overhead",
            "benchmarks.cost_validation", "benchmarks.peers"} <= names


@pytest.mark.parametrize("name", sorted(INVOCATIONS))
def test_help_exits_zero(name: str, help_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    run = help_runs[name]
    assert run.returncode == 0, f"{' '.join(run.args)}: rc {run.returncode}\n{run.stderr[-2000:]}"
    assert run.stdout.startswith("usage:"), run.stdout[:200]


def test_python_m_benchmarks_lists_every_benchmark_and_runs_one_by_name() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    names = {line.split()[0] for line in listed.stdout.splitlines()}
    assert {"load", "scaleout", "multiplex", "cost_validation", "engine_train",
            "peers.side_by_side"} <= names
    assert "load.client" not in names, "workers other benchmarks spawn are not benchmarks"
    run = subprocess.run([sys.executable, "-m", "benchmarks", "scheduler_overhead", "--help"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("usage:") and "--tenants" in run.stdout
