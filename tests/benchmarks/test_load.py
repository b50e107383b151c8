"""The load benchmark's arithmetic (percentiles, error grouping, flood and OpenAI windows and
ratios, RSS levels, goals, when abandoned sessions expire, who closes its session), its JSON layout,
and the ``--smoke`` configuration end to end against a real `loraplex serve` (structure only: no
performance numbers are asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.result import Result
from benchmarks.harness.writer import compact_json
from benchmarks.load.phases import retention_deadlines, soak_clients
from benchmarks.load.settings import SMOKE, Settings
from benchmarks.load.summary import (
    MIB,
    error_summary,
    goals,
    per_kind,
    percentile,
    rss_around,
    rss_summary,
    step_windows,
)
from loraplex.scheduler.futures import FETCHED_GRACE_S

REPO = Path(__file__).resolve().parents[2]


def op(kind: str, t0: float, latency_s: float, ok: bool = True, c: str = "a",
       err: str = "") -> dict[str, Any]:
    return {"c": c, "k": kind, "t0": t0, "t1": t0 + latency_s, "ok": ok,
            **({"err": err} if err else {})}


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_per_kind_times_only_successes_and_counts_failures() -> None:
    ops = [op("forward_backward", 0, 0.1), op("forward_backward", 1, 0.3),
           op("forward_backward", 2, 9.0, ok=False, err="boom"), op("sample_base", 0, 0.2)]
    table = per_kind(ops)
    assert table["forward_backward"]["n"] == 2 and table["forward_backward"]["errors"] == 1
    assert table["forward_backward"]["max_ms"] == pytest.approx(300.0)
    assert table["sample_base"]["p50_ms"] == pytest.approx(200.0)


def test_errors_group_by_message_with_ids_blanked() -> None:
    ops = [op("optim_step", 0, 1, ok=False, err="NotFound: req-0123456789abcdef gone"),
           op("optim_step", 1, 1, ok=False, err="NotFound: req-fedcba9876543210 gone"),
           op("sample_base", 2, 1, ok=False, err="Timeout"), op("sample_base", 3, 1)]
    summary = error_summary(ops)
    assert summary["count"] == 3
    assert summary["by_kind"] == {"optim_step": 2, "sample_base": 1}
    assert summary["messages"][0] == {"kind": "optim_step", "message": "NotFound: … gone",
                                      "count": 2}


def test_flood_window_keeps_slow_steps_and_baselines_keep_only_clean_ones() -> None:
    windows = {"baseline_a": (0.0, 10.0), "flood": (10.0, 20.0), "baseline_b": (30.0, 40.0)}
    steps = [op("train_step", t, 0.1) for t in range(0, 9)]  # A: p50 100 ms
    steps.append(op("train_step", 9.95, 5.0))  # starts in A, ends in the flood: dropped
    steps += [op("train_step", t, 0.3) for t in range(10, 19)]
    steps.append(op("train_step", 19.5, 20.0))  # starts in the flood, ends late: kept
    steps += [op("train_step", t, 0.1, c="b") for t in range(30, 39)]
    out = step_windows(steps, windows, "flood", ("baseline_a", "baseline_b"))
    assert (out["baseline_a"]["n"], out["flood"]["n"], out["baseline_b"]["n"]) == (9, 10, 9)
    assert out["baseline"]["n"] == 18 and out["baseline"]["per_tenant_n"] == {"a": 9, "b": 9}
    assert out["ratio"] == pytest.approx(3.0)
    assert out["ratio_a"] == pytest.approx(3.0) and out["ratio_b"] == pytest.approx(3.0)
    assert step_windows([], windows, "flood", ("baseline_a", "baseline_b"))["ratio"] is None


def test_openai_windows_divide_by_baselines_b_and_c() -> None:
    windows = {"baseline_b": (0.0, 10.0), "openai": (10.0, 20.0), "baseline_c": (25.0, 35.0)}
    steps = ([op("train_step", t, 0.1) for t in range(0, 9)]
             + [op("train_step", t, 0.15) for t in range(10, 20)]
             + [op("train_step", t, 0.3) for t in range(25, 34)])
    out = step_windows(steps, windows, "openai", ("baseline_b", "baseline_c"))
    assert out["ratio_b"] == pytest.approx(1.5) and out["ratio_c"] == pytest.approx(0.5)
    assert out["baseline"]["n"] == 18 and out["openai"]["n"] == 10


def test_rss_around_a_load_compares_the_spans_before_and_after_it() -> None:
    samples = [(float(t), (100 + (80 if 10 <= t < 15 else 0) + (5 if t >= 15 else 0)) * MIB)
               for t in range(25)]
    rss = rss_around(samples, load_start=10.0, after_end=24.0, span_s=3.0)
    assert rss["before_mib"] == 100 and rss["after_mib"] == 105 and rss["peak_mib"] == 180
    assert rss["after_over_before"] == pytest.approx(1.05)


def test_rss_levels_are_medians_over_the_span() -> None:
    samples = [(float(t), (100 + (50 if 5 <= t < 8 else 0)) * MIB) for t in range(20)]
    samples[16] = (16.0, 108 * MIB)
    rss = rss_summary(samples, warm_at=1.0, soak_end=9.0, expired_at=12.0, final_at=15.0,
                      span_s=2.0)
    assert rss["post_warmup_mib"] == 100 and rss["peak_soak_mib"] == 150
    assert rss["final_mib"] == 100 and rss["final_over_post_warmup"] == 1.0
    late = rss_summary(samples, warm_at=1.0, soak_end=9.0, expired_at=12.0, final_at=15.5,
                       span_s=0.1)  # no sample inside: the first one after
    assert late["final_mib"] == 108


def test_goals_fail_on_missing_values() -> None:
    rss = {"final_over_post_warmup": 1.05}
    ok = goals(0, rss, 1.5, 1.9, 1.08, rss_tolerance=0.1, ratio_limit=2.0)
    assert all(g["pass"] for g in ok.values())
    bad = goals(1, {"final_over_post_warmup": None}, None, None, None, rss_tolerance=0.1,
                ratio_limit=2.0)
    assert not any(g["pass"] for g in bad.values())
    over = goals(0, rss, 1.5, 2.1, 1.2, rss_tolerance=0.1, ratio_limit=2.0)
    assert not over["openai_ratio"]["pass"] and not over["openai_rss_back"]["pass"]


def test_half_of_each_role_closes_its_session() -> None:
    specs = soak_clients(Settings(clients=8), "r")
    for role in ("train", "sample"):
        mine = [s for s in specs if s.role == role]
        assert len(mine) == 4 and sum(s.close_session for s in mine) == 2
    assert len({s.api_key for s in specs}) == 8


def test_abandoned_sessions_expire_after_their_last_possible_heartbeat() -> None:
    settings = Settings(clients=4, session_idle_s=30.0, housekeeping_s=2.0,
                        wait_fetched_grace=False)
    specs = soak_clients(settings, "r")  # soak-02, soak-03 abandon theirs
    soak = {"specs": specs, "closed": {"soak-00", "soak-01"},
            "created": {s.name: 100.0 for s in specs},
            "exited": {s.name: 105.0 for s in specs}}
    # Exited 5 s after creation: no heartbeat was sent, so the idle clock started at creation.
    assert retention_deadlines(settings, soak, 104.0) == (133.0, 133.0)  # + 30 + 2 + 1
    soak["exited"] = {s.name: 160.0 for s in specs}  # heartbeats until at most the exit
    assert retention_deadlines(settings, soak, 159.0) == (193.0, 193.0)
    grace = replace(settings, wait_fetched_grace=True)
    assert retention_deadlines(grace, soak, 159.0) == (193.0, 159.0 + FETCHED_GRACE_S + 3)


def test_compact_json_puts_each_record_on_one_line() -> None:
    value = {"a": {"b": [1, 2]}, "rows": [[0.5, "x", True], [1.5, "y", False]], "e": {}}
    text = compact_json(value)
    assert json.loads(text) == value
    assert '  [0.5, "x", true],' in text.splitlines()


@pytest.mark.slow
def test_smoke_run_end_to_end_writes_json_md_png(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "benchmarks.load", "--smoke", "--out",
                           str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    record = Result.read(tmp_path / "load.json")
    assert record.start.probe and record.end.probe and record.wall_s > 0
    result = record.payload
    assert {"settings", "git", "phases", "soak", "rss", "flood", "openai", "goals", "raw",
            "num_errors"} <= set(result)
    assert result["smoke"] and "commit" in result["git"]
    assert result["settings"]["clients"] == SMOKE.clients
    assert [p["name"] for p in result["phases"]] == [
        "soak", "stopping", "expiry", "baseline_a", "flood", "drain", "baseline_b", "openai",
        "openai_stop", "baseline_c"]
    assert {"forward_backward", "optim_step", "sample_base", "sample_adapter",
            "save_weights_and_get_sampling_client", "save_weights_for_sampler",
            "create_sampling_client"} <= set(result["soak"]["ops"])
    assert result["soak"]["closed_sessions"] and result["soak"]["abandoned_sessions"]
    for key in ("post_warmup_mib", "peak_mib", "at_expiry_mib", "final_mib"):
        assert result["rss"][key] > 0
    normal, flooder = result["flood"]["normal"], result["flood"]["flooder"]
    assert normal["baseline"]["n"] > 0 and normal["flood"]["n"] > 0
    assert flooder["accepted"] > 0 and flooder["accepted"] == flooder["completed"] + (
        flooder["failed"])
    oai = result["openai"]
    assert set(oai["clients"]) == {"completion", "completion_stream", "chat", "chat_stream"}
    assert all(k["n"] > 0 for k in oai["clients"].values()) and oai["tokens"] > 0
    assert oai["ttft"]["chat_stream"]["n"] > 0 and oai["normal"]["openai"]["n"] > 0
    assert oai["rss"]["after_mib"] > 0 and oai["rss"]["before_mib"] > 0
    assert set(result["goals"]) == {"errors", "rss_back", "flood_ratio", "openai_ratio",
                                    "openai_rss_back"}
    assert all(isinstance(g["pass"], bool) for g in result["goals"].values())
    assert result["raw"]["ops"] and result["raw"]["rss"]
    md = (tmp_path / "load.md").read_text()
    assert "| goal | value | target | verdict |" in md
    assert "| op kind | ok | errors | p50 ms | p99 ms | max ms |" in md
    assert "| `forward_backward` |" in md and "![load](load.png)" in md
    assert "| `chat_stream` |" in md and "## OpenAI API: 4 clients" in md
    png = (tmp_path / "load.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert elapsed < 120, f"the smoke run took {elapsed:.0f} s"
