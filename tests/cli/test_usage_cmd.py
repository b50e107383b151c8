"""`loraplex usage`: reads a data dir's usage table directly, every tenant, table or JSON."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from loraplex.cli.main import main
from loraplex.store.stores import open_stores
from loraplex.store.usage import UsageCounts, UsageKey

NOW_HOUR = int(time.time()) // 3600 * 3600


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    stores = open_stores(str(tmp_path / "data"))
    stores.usage.add({
        UsageKey("alice", "s1:train:0", "Qwen/Qwen3-8B", "ForwardBackward", NOW_HOUR):
            UsageCounts(num_ops=3, engine_s=1.5, trained_tokens=1_000_000),
        UsageKey("alice", "", "Qwen/Qwen3-8B", "Sample", NOW_HOUR):
            UsageCounts(num_ops=1, engine_s=0.5, prompt_tokens=250_000,
                        rollout_prompt_tokens=1_000_000, sampled_tokens=500_000,
                        num_sequences=4),
        UsageKey("bob", "s2:train:0", "Qwen/Qwen3-8B", "Sample", NOW_HOUR - 10 * 3600):
            UsageCounts(num_ops=1, prompt_tokens=10, rollout_prompt_tokens=10),
    })
    stores.close()
    return str(tmp_path / "data")


def test_json_lists_every_tenant_with_runs_and_both_bills(
    data_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["usage", "--data-dir", data_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    alice, bob = report["tenants"]
    assert (alice["tenant"], bob["tenant"]) == ("alice", "bob")
    assert [r["run_id"] for r in alice["runs"]] == ["s1:train:0", None]
    bills = alice["totals"]["bill_usd"]
    # 1M trained × $0.40 + 1M rollout prompt × $0.13 + 0.5M sampled × $0.40 per 1M
    assert bills["per_rollout"]["total"] == pytest.approx(0.40 + 0.13 + 0.20)
    # cache_aware: the prompt is prefilled once (0.25M), its 3 other copies at 20%
    assert bills["cache_aware"]["total"] == pytest.approx(
        0.40 + 0.25 * 0.13 + 0.75 * 0.13 * 0.2 + 0.20)
    assert alice["totals"]["engine_s"] == {"total": 2.0, "ForwardBackward": 1.5, "Sample": 0.5}


def test_filters_and_the_table(data_dir: str, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")  # rich sizes the table to the terminal
    assert main(["usage", "--data-dir", data_dir, "--json", "--hours", "2"]) == 0
    assert [t["tenant"] for t in json.loads(capsys.readouterr().out)["tenants"]] == ["alice"]
    assert main(["usage", "--data-dir", data_dir, "--json", "--tenant", "bob"]) == 0
    assert [t["tenant"] for t in json.loads(capsys.readouterr().out)["tenants"]] == ["bob"]
    assert main(["usage", "--data-dir", data_dir]) == 0
    table = capsys.readouterr().out
    for text in ("alice", "bob", "s1:train:0", "base", "total", "tinker-2026-01-05",
                 "1,000,000", "0.730000"):
        assert text in table


def test_errors_name_the_problem(tmp_path: Path, data_dir: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--data-dir", str(tmp_path / "nowhere")]) == 2
    assert "no loraplex database" in capsys.readouterr().err
    assert main(["usage", "--data-dir", data_dir, "--price-sheet", "nope"]) == 2
    assert "unknown sheet" in capsys.readouterr().err
    assert main(["usage", "--data-dir", data_dir, "--model-map", "oops"]) == 2
    assert "NAME=MODEL" in capsys.readouterr().err
