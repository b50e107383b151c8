"""The side-by-side harness: ratios pooled over interleaved rounds (hand-computed), and one
`client_bench.py` run with the side-by-side flags against a real `loraplex serve` it starts
pinned to one core (the official SDK; samples past EOS come back at exactly max_tokens)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.peers import side_by_side
from benchmarks.peers.client import run_client


def _run(step_s: list[float], fan: tuple[list[float], list[int]],
         batch: tuple[list[float], list[int]]) -> dict[str, object]:
    return {"train": {"tokens_per_step": 2048, "step_s": step_s},
            "sample_fanout": {"round_s": fan[0], "gen_tokens": fan[1]},
            "sample_batch": {"round_s": batch[0], "gen_tokens": batch[1]}}


def test_ratios_pool_every_timed_step_and_round_across_rounds() -> None:
    rounds = [
        {"loraplex": _run([2.0, 4.0], ([10.0], [2048]), ([4.0], [512])),
         "skyrl": _run([8.0, 8.0], ([30.0], [2048]), ([4.0], [512]))},
        {"loraplex": _run([3.0, 5.0], ([6.0], [2048]), ([6.0], [512])),
         "skyrl": _run([6.0, 10.0], ([34.0], [2048]), ([6.0], [512]))},
    ]
    ours = side_by_side.pooled(rounds, "loraplex")
    theirs = side_by_side.pooled(rounds, "skyrl")
    assert ours["train"] == pytest.approx(2048 / 3.5)  # median of 2, 3, 4, 5
    assert theirs["train"] == pytest.approx(2048 / 8.0)
    assert ours["sample_fanout"] == pytest.approx(4096 / 16.0)
    assert theirs["sample_fanout"] == pytest.approx(4096 / 64.0)
    ratio = side_by_side.ratios(ours, theirs)
    assert ratio == pytest.approx({"train": 8 / 3.5, "sample_fanout": 4.0, "sample_batch": 1.0})
    per_round = side_by_side.per_round_ratios(rounds)
    assert per_round[0]["train"] == pytest.approx(8.0 / 3.0)
    assert per_round[1]["sample_fanout"] == pytest.approx(34 / 6)


def test_missing_workload_gives_no_ratio() -> None:
    assert side_by_side.ratios({"train": 5.0, "sample_fanout": None, "sample_batch": 1.0},
                               {"train": 0.0, "sample_fanout": 2.0, "sample_batch": 2.0}
                               ) == {"train": None, "sample_fanout": None, "sample_batch": 0.5}


def test_client_bench_flags_against_a_pinned_loraplex_server(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    vocab = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    with side_by_side.start_loraplex(tiny_model_dir, "tiny", tmp_path / "data", 1) as server:
        assert side_by_side.affinity(server.process.pid) == "0"
        result = run_client(sys.executable, server.base_url, server.base_model, [
            "--rank", "4", "--train-unembed", "false", "--vocab-limit", str(vocab),
            "--train-lengths", "8,12", "--warmup-steps", "0", "--steps", "1",
            "--pipelined-steps", "0", "--prompt-len", "6", "--num-prompts", "1",
            "--fanout-samples", "3", "--batch-prompts", "2", "--max-tokens", "5",
            "--sample-past-eos", "--warmup-rounds", "0", "--rounds", "1"], tmp_path / "out.json")
        assert side_by_side.group_cpu_s(server.process.pid) > 0
    assert result["train"]["tokens_per_step"] == 20 and len(result["train"]["step_s"]) == 1
    assert result["train"]["pipelined"]["tok_per_s"] is None
    assert result["sample_fanout"]["gen_tokens"] == [1 * 3 * 5]
    assert result["sample_batch"]["gen_tokens"] == [2 * 1 * 5]
    assert result["sample_batch"]["num_prompts"] == 2


def _client_result(step_s: list[float], fan_s: float, batch_s: float) -> dict[str, object]:
    sample = {"num_prompts": 4, "prompt_len": 128, "num_samples": 8, "max_tokens": 64}
    return {"sdk_version": "0.38.0", "rank": 16, "load_avg": {"start": [1.0], "end": [2.0]},
            "train": {"num_sequences": 2, "lengths": [1024, 1024], "tokens_per_step": 2048,
                      "step_s": step_s},
            "sample_fanout": {**sample, "round_s": [fan_s], "gen_tokens": [2048]},
            "sample_batch": {**sample, "num_prompts": 8, "num_samples": 1, "round_s": [batch_s],
                             "gen_tokens": [512]},
            "server_cpu_s": 50.0, "wall_s": 30.0, "server_peak_rss_mib": 900,
            "affinity": "0-1", "jit_compiles": [{"mode": "train", "seq_len": 384, "s": 6.5}]}


def test_markdown_reports_each_ratio_against_its_goal() -> None:
    from benchmarks.harness.result import Run
    from benchmarks.peers.side_by_side_report import markdown

    rounds = [{"order": ["loraplex", "skyrl"], "loraplex": _client_result([4.0, 4.0], 8.0, 2.0),
               "skyrl": _client_result([16.0, 16.0], 16.0, 2.0)}]
    ours, theirs = side_by_side.pooled(rounds, "loraplex"), side_by_side.pooled(rounds, "skyrl")
    text = markdown(Run("peers_smollm2", probe=False).finish({
        "model": "smollm2", "model_dir": "/m", "threads": 2, "cores": 2,
        "git": {"commit": "abc", "loraplex_dirty": False},
        "affinity": {"loraplex": "0-1", "skyrl": "0-1"},
        "skyrl": {"version": "0.4.0", "dtype": "float32", "backend_config": {}}, "rounds": rounds,
        "tok_per_s": {"loraplex": ours, "skyrl": theirs},
        "ratio_vs_skyrl": side_by_side.ratios(ours, theirs),
        "ratio_vs_skyrl_per_round": side_by_side.per_round_ratios(rounds),
        "goals": side_by_side.GOALS}))
    assert "| **4.00** | ≥ 3.0 (met) |" in text  # training 512 vs 128 tok/s
    assert "| **2.00** | ≥ 3.0 (not met) |" in text  # fan-out 256 vs 128
    assert "| **1.00** | ≥ 1.2 (not met) |" in text  # batch
