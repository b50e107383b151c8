"""The benchmark suite's manifest covers every committed result with a command this checkout
can run, whose arguments its benchmark's own parser accepts; the runner runs entries one after
another past failures and counts an entry only when it wrote its results file. No benchmark
runs here: the runner is driven with a fake entry script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks import REPO, RESULTS
from benchmarks.suite import runner
from benchmarks.suite.__main__ import main
from benchmarks.suite.arguments import parse_error
from benchmarks.suite.manifest import ENTRIES, Entry, available, by_stem
from benchmarks.suite.report import payload
from benchmarks.suite.runner import display, ordered, run_all

#: What the suite writes about itself: a summary, not a benchmark's result.
NOT_BENCHMARK_RESULTS = {"suite"}

FAKE = """\
import pathlib, sys, time
mode, stem, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
print("fake entry", stem, mode, flush=True)
if mode == "slow":
    time.sleep(30)
if mode == "fail":
    sys.exit(3)
if mode == "write":
    (out / f"{stem}.json").write_text("{}")
"""


def test_every_committed_result_has_a_manifest_entry() -> None:
    stems = {str(path.relative_to(RESULTS).with_suffix(""))
             for path in RESULTS.rglob("*.json")} - NOT_BENCHMARK_RESULTS
    assert "engine_train" in stems and "dashboard/render" in stems
    missing = sorted(stems - set(by_stem()))
    assert not missing, (f"results without a recipe in benchmarks/suite/manifest.py: {missing}; "
                         "add the command that regenerates each")


def test_stems_are_unique() -> None:
    assert len(by_stem()) == len(ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.stem)
def test_each_entry_runs_something_in_this_checkout(entry: Entry) -> None:
    if entry.elsewhere:
        assert not available(entry), (
            f"{entry.module} is in this checkout now: remove {entry.stem}'s "
            f"elsewhere={entry.elsewhere!r} from benchmarks/suite/manifest.py")
    else:
        assert available(entry), f"{entry.stem}: no {entry.module} in this checkout"


def test_every_entrys_arguments_parse_with_its_benchmarks_parser() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "benchmarks", "suite", "--check"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checked = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("ok ")]
    assert checked == [entry.stem for entry in ordered(ENTRIES)]


def test_the_parse_check_rejects_what_the_benchmarks_parser_rejects(tmp_path: Path) -> None:
    def entry(*args: str) -> Entry:
        return Entry("scheduler_overhead", "scheduler_overhead", args, 1)

    assert parse_error(entry("--tenants", "3"), tmp_path) is None
    assert "invalid int value" in (parse_error(entry("--tenants", "many"), tmp_path) or "")
    assert "unrecognized arguments" in (parse_error(entry("--tennants", "3"), tmp_path) or "")
    assert not any(tmp_path.iterdir()), "the check runs nothing"


def test_dry_run_prints_every_command_quick_ones_first_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    assert main(["--dry-run", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    order = ordered(ENTRIES)
    assert len(lines) == len(order)
    assert [entry.minutes for entry in order] == sorted(entry.minutes for entry in ENTRIES)
    for line, entry in zip(lines, order, strict=True):
        assert line.endswith(display(entry, out)), (line, entry.stem)
        assert line.startswith("#") != available(entry)
    train = lines[order.index(by_stem()["engine_train_smollm2"])]
    assert train == (f"python -m benchmarks engine_train --model smollm2 --rounds 2 --threads 1 "
                     f"--out {out}")
    assert not out.exists()


def test_only_and_skip_select_entries(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run", "--only", "memory,packed_gemm,load", "--skip", "load"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines] == ["packed_gemm", "memory"]
    with pytest.raises(SystemExit):
        main(["--dry-run", "--only", "no_such_result"])


def fake_entries(tmp_path: Path) -> Callable[[str, str], Entry]:
    """Entries running `FAKE` with a mode: write its result, fail, exit 0 silently, or sleep."""
    script = tmp_path / "fake_entry.py"
    script.write_text(FAKE)

    def fake(stem: str, mode: str) -> Entry:
        return Entry(stem, str(script), (mode, stem), 1, out=("{out}",), launcher=())

    return fake


def test_runner_goes_past_failures_and_counts_only_written_results(tmp_path: Path) -> None:
    fake = fake_entries(tmp_path)
    out, logs = tmp_path / "results", tmp_path / "logs"
    out.mkdir()
    (out / "stale.json").write_text("{}")  # an old result that the entry does not rewrite
    entries = [fake("written", "write"), fake("broken", "fail"), fake("stale", "silent"),
               Entry("elsewhere", "no_such_benchmark", (), 1, elsewhere="other"),
               fake("after", "write")]
    said: list[str] = []
    outcomes = run_all(entries, out, logs, said.append)
    assert [(o.stem, o.status, o.returncode) for o in outcomes] == [
        ("written", "ok", 0), ("broken", "failed", 3), ("stale", "no_result", 0),
        ("elsewhere", "missing", None), ("after", "ok", 0)]
    assert "fake entry broken fail" in (logs / "broken.log").read_text()
    assert any(line.startswith("[5/5] after") for line in said)
    summary = payload([*entries, fake("not_started", "write")], outcomes, out, logs, [])
    assert summary["not_ok"] == ["broken", "stale", "elsewhere", "not_started"]
    assert summary["entries"][-1]["status"] == "not_run"
    json.dumps(summary)  # the harness writes it as JSON


def test_a_running_entry_reports_its_log_and_ctrl_c_stops_it_and_the_suite(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_entries(tmp_path)
    monkeypatch.setattr(runner, "HEARTBEAT_S", 0.5)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "fake entry slow" in line:  # the heartbeat shows the log: press Ctrl-C
            raise KeyboardInterrupt

    t0 = time.monotonic()
    outcomes = run_all([fake("slow", "slow"), fake("next", "write")], tmp_path / "out",
                       tmp_path / "logs", say)
    assert [(o.stem, o.status) for o in outcomes] == [("slow", "interrupted")]
    assert outcomes[0].returncode not in (0, None), "the entry was stopped, not left running"
    assert time.monotonic() - t0 < 20, "stopped well before its 30 s sleep"
    assert not (tmp_path / "out" / "next.json").exists()
