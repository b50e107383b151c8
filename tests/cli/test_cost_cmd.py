"""`loraplex cost compare | table` through the command's own parser."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.cli import cost_cmd, main


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="loraplex")
    cost_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cost", *argv])
    return int(args.func(args))


def test_registered_in_the_entry_point() -> None:
    assert "loraplex.cli.cost_cmd" in main.COMMAND_MODULES


def test_compare_prints_both_breakdowns_and_the_verdict(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert run(["compare", "--workload", "swe_rl"]) == 0
    out = capsys.readouterr().out
    for item in ("prefill", "cached prefill", "sample", "train", "storage", "decode weights",
                 "decode kv", "environment wait", "fixed", "w/ prefix caching"):
        assert item in out
    assert "GPUs 8 × h100_sxm (TP 2 × 4 replicas)" in out
    assert "wall-clock 367.4 h" in out and "utilization 100%" in out
    assert "winner: self-hosted, 4.90× cheaper" in out
    assert "seed-calibrated" in out and "known deviation (tinker_cached_usd)" in out


def test_flags_override_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    run(["compare", "--workload", "math_rl", "--json"])
    base = json.loads(capsys.readouterr().out)
    run(["compare", "--workload", "math_rl", "--json", "--steps", "90", "--hardware", "h200",
         "--usd-per-gpu-hour", "3.0"])
    changed = json.loads(capsys.readouterr().out)
    assert changed["tinker"]["total_usd"] == pytest.approx(base["tinker"]["total_usd"] / 2,
                                                           abs=0.01)
    assert changed["self_hosted"]["hardware"] == "h200"
    assert changed["self_hosted"]["usd_per_gpu_hour"] == 3.0


def test_toml_config_then_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text('preset = "osworld_rl"\ncalibration = "physical"\n'
                      '[workload]\nturns = 10\n[self_host]\nmode = "sync"\n'
                      "[tinker_cached]\ncached_prefill_ratio = 0.2\n")
    run(["compare", "--config", str(config), "--json", "--turns", "12"])
    out = json.loads(capsys.readouterr().out)
    assert out["workload"] == "osworld_rl" and out["calibration"] == "physical"
    assert out["tinker_cached"]["breakdown_usd"]["cached_prefill"] > 0
    steps = out["self_hosted"]["step_seconds"]
    assert steps["env"] == pytest.approx(12 * 10.0)  # the physical 10 s/turn, 12 turns
    assert steps["wall"] == pytest.approx(sum(v for k, v in steps.items() if k != "wall"))


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('preset = "math_rl"\n[workload]\nstepz = 3\n')
    with pytest.raises(SystemExit, match=r"workload: unknown keys \['stepz'\]"):
        run(["compare", "--config", str(config)])
    with pytest.raises(SystemExit, match="give a preset"):
        run(["compare"])


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "swe.png"
    run(["compare", "--workload", "swe_rl", "--plot", str(target)])
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["table", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["workload"], r["winner"]) for r in rows] == [
        ("math_rl", "self_hosted"), ("code_rl", "tinker"), ("harbor_rl", "tinker"),
        ("swe_rl", "self_hosted"), ("osworld_rl", "self_hosted")]
    assert rows[3]["tinker_usd"] == pytest.approx(38733, rel=0.02)
    assert rows[1]["known_deviations"][0]["cell"] == "tinker_usd"


def test_table_human_output_flags_deviations(capsys: pytest.CaptureFixture[str]) -> None:
    run(["table"])
    out = capsys.readouterr().out
    assert "$38,732" in out and "($38,733)" in out and "†" in out
    assert "known deviation code_rl tinker_usd" in out


def test_heavy_imports_stay_lazy() -> None:
    code = ("import sys, loraplex.cli.cost_cmd; "
            "print(any(m in sys.modules for m in ('matplotlib', 'rich', 'torch')))")
    lazy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert lazy.stdout.strip() == "False"


def test_help_text_documents_fields(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(["compare", "--help"])
    out = capsys.readouterr().out
    assert "--prompt-tokens" in out and "initial prompt length" in out
    assert "--cached-cache-hit-rate" in out and "--decode-mbu" in out
