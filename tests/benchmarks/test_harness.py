"""The benchmark harness: a `Result` survives the writer and reads back whole; a results file of
either layout gives its payload, and the reports render from it; the no-op executor's
checkpoints load back."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from benchmarks import RESULTS
from benchmarks.harness.fakes import NoopExecutor
from benchmarks.harness.result import SCHEMA, Result, Run, read_payload
from benchmarks.harness.writer import write
from loraplex.domain.lora import LoraConfig
from loraplex.domain.work import LoadWork, SaveWork


def test_a_written_result_reads_back_equal_with_its_markdown_beside_it(tmp_path: Path) -> None:
    run = Run("toy_bench", probe=False)
    result = run.finish({"ratio": 1.5, "rows": [[1, 2], [3, 4]]}, model="builtin:tiny")
    path = write(result, f"# toy\n\n{result.provenance()}", tmp_path)
    assert path == tmp_path / "toy_bench.json"
    assert Result.read(path) == result
    assert json.loads(path.read_text())["schema"] == SCHEMA
    assert (tmp_path / "toy_bench.md").read_text().startswith("# toy\n\nMeasured ")
    assert not (tmp_path / "toy_bench.png").exists()
    assert result.start.load_avg and result.end.probe is None and result.wall_s >= 0


def test_read_payload_reads_a_harness_record_and_a_file_from_before_it(tmp_path: Path) -> None:
    result = Run("new", probe=False).finish({"ratio": 2.0})
    new = write(result, "# new", tmp_path)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"ratio": 3.0, "load_avg_start": [1, 1]}))
    assert read_payload(new) == {"ratio": 2.0}
    assert read_payload(old)["ratio"] == 3.0


def test_noop_executor_checkpoint_loads_back_its_config(tmp_path: Path) -> None:
    executor = NoopExecutor()
    config = LoraConfig(rank=4, seed=3, train_mlp=False)
    executor.create_adapter("a", config)
    saved = str(tmp_path / "ckpt")
    assert executor.save_adapter(SaveWork("a", saved, with_optimizer=False)).size_bytes > 0
    prepared = executor.read_checkpoint(LoadWork("b", saved, with_optimizer=False))
    assert executor.install_adapter("b", prepared).config == config
    assert executor.has_adapter("b")


REPORTS = {  # committed result → its report's markdown (results recorded with their goals)
    "engine_families": "benchmarks.engine_families", "memory": "benchmarks.memory",
    "model_parallel": "benchmarks.model_parallel", "real_model_rl": "benchmarks.real_model_rl",
    "cost_validation": "benchmarks.cost_validation.report",
    "peers_smollm2": "benchmarks.peers.side_by_side_report",
    "load": "benchmarks.load.report", "scaleout": "benchmarks.scaleout.report"}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_a_report_renders_from_its_committed_result_of_either_layout(name: str) -> None:
    result = Run(name, probe=False).finish(read_payload(RESULTS / f"{name}.json"))
    markdown = importlib.import_module(REPORTS[name]).markdown
    args = ("x.png",) if name in ("load", "scaleout") else ()
    assert result.provenance() in markdown(result, *args)
