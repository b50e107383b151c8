"""`scripts/check_numbers.py`: every number the README and the docs mark with its results file
matches that file, and the check fails on a stale number, a wrong path or a missing file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_numbers",
                                                  REPO / "scripts" / "check_numbers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check_numbers = _script()


def test_every_quoted_number_matches_its_results_file() -> None:
    count, bad = check_numbers.check_all(REPO)
    assert count >= 50, "the README and docs lost their number markers"
    assert not bad, "\n".join(map(str, bad))


def _tree(tmp_path: Path, readme: str, results: dict[str, object]) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "benchmarks" / "results" / "bench.json").write_text(json.dumps(results))
    return tmp_path


@pytest.mark.parametrize(("text", "ok"), [
    ("ratio 4.7×<!--r bench summary.on/distinct.ratio-->", True),
    ("ratio 4.72×<!--r bench summary.on/distinct.ratio-->", True),
    ("ratio 4.8×<!--r bench summary.on/distinct.ratio-->", False),
    ("ratio 4.71×<!--r bench summary.on/distinct.ratio-->", False),
    ("11,326<!--r bench runs.1.ops--> ops", True),
    ("11,327<!--r bench runs.1.ops--> ops", False),
    ("at 2.5 %<!--r bench share *100-->", True),
    ("6.9e-5<!--r bench tiny-->", True),
    ("7.9e-5<!--r bench tiny-->", False),
    ("4.7×<!--r bench summary.on/nothing.ratio-->", False),
    ("4.7×<!--r missing summary.on/distinct.ratio-->", False),
    ("no number here <!--r bench share-->", False),
])
def test_the_check_can_fail(tmp_path: Path, text: str, ok: bool) -> None:
    repo = _tree(tmp_path, text, {"summary": {"on/distinct": {"ratio": 4.7213}},
                                  "runs": [{"ops": 7}, {"ops": 11326}], "share": 0.0254,
                                  "tiny": 6.866e-5})
    count, bad = check_numbers.check_all(repo)
    assert count == 1
    assert (not bad) == ok, bad


def test_a_harness_result_is_read_under_its_payload(tmp_path: Path) -> None:
    envelope = {"schema": "loraplex-benchmark-result/1", "name": "bench", "wall_s": 9.0,
                "payload": {"ratio": 3.49}}
    repo = _tree(tmp_path, "3.49×<!--r bench ratio-->", envelope)
    assert check_numbers.check_all(repo) == (1, [])
