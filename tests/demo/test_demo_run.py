"""A shortened `loraplex demo` through the real CLI: the pass rate rises and the sampler's
logprobs equal the trainer's (batch-invariant mode), and every promised output is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RL_STEPS = 10


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    cmd = [sys.executable, "-m", "loraplex", "demo", "--out", str(out), "--steps", str(RL_STEPS),
           "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_pass_rate_rises_and_sampler_matches_trainer(demo_out: Path) -> None:
    summary = json.loads((demo_out / "summary.json").read_text())
    assert summary["sft_pass_rate"] <= 0.6
    assert summary["final_pass_rate"] >= summary["sft_pass_rate"] + 0.25
    assert summary["heldout_pass_rate"] >= summary["sft_pass_rate"] + 0.25
    assert summary["max_abs_kl_sample_train"] == 0.0


def test_metrics_rows_cover_both_phases(demo_out: Path) -> None:
    rows = [json.loads(line) for line in (demo_out / "metrics.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in rows]
    assert phases.count("rl") == RL_STEPS and phases.count("sft") > 0
    for row in rows:
        assert {"phase", "step", "loss", "pass_rate", "kl_sample_train"} <= row.keys()
    sft_losses = [r["loss"] for r in rows if r["phase"] == "sft"]
    assert sft_losses[-1] < sft_losses[0] / 10


def test_manifest_tags_every_trajectory_with_its_policy_version(demo_out: Path) -> None:
    manifest = json.loads((demo_out / "manifest.json").read_text())
    assert manifest["lora"]["rank"] > 0 and manifest["loss"]["rl"] == "importance_sampling"
    assert len(manifest["steps"]) == RL_STEPS
    for step in manifest["steps"]:
        assert step["sampler_path"].startswith("tinker://")
        assert "/sampler_weights/" in step["sampler_path"]
        for traj in step["trajectories"]:
            assert traj["policy_version"] == step["sampler_path"]
            assert {"tokens", "reward", "group_mean", "mask_tokens"} <= traj.keys()
    assert (demo_out / "curves.png").stat().st_size > 10_000
