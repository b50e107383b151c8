"""The scale-out benchmark's arithmetic (the throughput window, the 2 ÷ 1 ratios, the page-move
split, the recovery timeline, the goals), its process-tree CPU accounting on real processes,
and the smoke configuration end to end (real servers with Ray workers, real SDK tenants)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.result import Result
from benchmarks.scaleout.__main__ import SMOKE, goals_of
from benchmarks.scaleout.dispatch import cycle_works
from benchmarks.scaleout.paging import split_ms
from benchmarks.scaleout.procs import TreeCpu, process_tree
from benchmarks.scaleout.recovery import Monitor, Op, Tenant, summarize
from benchmarks.scaleout.throughput import WORKLOADS, derive, window_tokens

REPO = Path(__file__).resolve().parents[2]


def _step(worker: int, t0: float, t1: float, tokens: int = 100) -> dict[str, Any]:
    return {"worker": worker, "t0": t0, "t1": t1, "trained_tokens": tokens,
            "sampled_tokens": tokens // 10}


def test_window_counts_the_part_of_each_step_inside_it() -> None:
    steps = [_step(0, 10.0, 12.0), _step(0, 12.0, 16.0),  # the second half outside
             _step(1, 9.0, 11.0),  # started before the window (warm-up): half inside
             _step(1, 15.0, 20.0, 50)]  # entirely after
    trained, sampled = window_tokens(steps, t_go=10.0, t_end=14.0)
    assert trained == pytest.approx(100 + 50 + 50)
    assert sampled == pytest.approx(10 + 5 + 5)


def _run(tok_s: float, per_cpu: float = 1.0, cores: float = 1.0) -> dict[str, Any]:
    shares = {"server": 0.1, "ray": 0.0, "engine_workers": 0.4, "tenants": 0.1, "other": 0.4,
              "total": 0.5, "machine_busy": 1.0}
    return {"aggregate_tok_s": tok_s, "tok_per_cpu_s": per_cpu, "cpu_cores_used": cores,
            "cpu_s": {"engine_workers": tok_s / 10}, "cpu_share": shares,
            "lanes": [{"utilization": 0.9}], "worker_cpu_per_busy_s": 0.8,
            "tok_per_worker_cpu_s": 10.0}


def test_ratios_are_medians_of_the_ratio_within_each_round() -> None:
    derived = derive({1: [_run(100), _run(50), _run(100)],
                      2: [_run(150), _run(100), _run(300, per_cpu=2.0, cores=3.0)]})
    assert derived["ratio_per_round"] == pytest.approx([1.5, 2.0, 3.0])
    assert derived["throughput_ratio_2v1"] == pytest.approx(2.0)
    assert derived["throughput_ratio_2v1_cpu"] == pytest.approx(1.0)
    assert derived["cpu_rate_ratio_2v1"] == pytest.approx(1.0)
    assert derived["worker_cpu_ratio_2v1"] == pytest.approx(2.0)
    assert derived["where"]["2"]["worker_utilization"] == [0.9]


def test_page_in_cost_is_what_swaps_took_beyond_their_page_outs() -> None:
    steps = [{"page_s": 0.0, "outs": 0, "ins": 0},  # fits: nothing moved
             {"page_s": 0.004, "outs": 1, "ins": 0}, {"page_s": 0.006, "outs": 1, "ins": 0},
             {"page_s": 0.012, "outs": 1, "ins": 1}, {"page_s": 0.016, "outs": 1, "ins": 1}]
    split = split_ms(steps)
    assert split["page_out_ms"] == pytest.approx(5.0)
    assert split["page_in_ms"] == pytest.approx(9.0)  # (28 - 2 × 5) / 2
    assert split["swap_ms"] == pytest.approx(14.0)
    assert split["mean_move_ms"] == pytest.approx(38 / 6)


def test_a_cycle_payload_holds_every_tenants_batch() -> None:
    workload = WORKLOADS["small"]
    fwd_bwd, optim = cycle_works(workload, ("sft", "grpo"), 4)
    assert [w.loss_fn for w in fwd_bwd] == ["cross_entropy", "importance_sampling"] * 2
    assert [len(w.data) for w in fwd_bwd] == [2, 4, 2, 4]
    assert fwd_bwd[1].data[0].length == 48 + 16 - 1
    assert {"logprobs", "advantages", "target_tokens"} == set(fwd_bwd[1].data[0].loss_fn_inputs)
    assert [o.adapter_id for o in optim] == [w.adapter_id for w in fwd_bwd]


def test_process_tree_finds_grandchildren_and_counts_their_cpu() -> None:
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"p = subprocess.Popen([sys.executable, '-c', {spin!r} + 'time.sleep(30)'])\n"
         "time.sleep(30)"])
    try:
        before = TreeCpu.read(child.pid)
        deadline = time.monotonic() + 30
        while len(process_tree(child.pid)) < 2 or TreeCpu.read(child.pid).since(
                before)["ray"] < 0.25:
            assert time.monotonic() < deadline, "no grandchild spun"
            time.sleep(0.1)
        tree = process_tree(child.pid)
        assert tree[0].pid == child.pid and tree[1].ppid == child.pid
        spent = TreeCpu.read(child.pid).since(before)
        assert spent["ray"] >= 0.25 and spent["engine_workers"] == 0.0  # roles by title
        assert spent["total"] == pytest.approx(spent["server"] + spent["ray"])
    finally:
        for proc in process_tree(child.pid)[::-1]:
            os.kill(proc.pid, 9)
        child.wait()


def test_recovery_counts_the_lost_lanes_tenants_and_the_time_to_their_next_step() -> None:
    def tenant(index: int, ops: list[Op], acked: int) -> Tenant:
        t = Tenant(index, "http://h", "tml-x", "tiny", ops=ops, acked=[f"p{index}-{i}"
                                                                       for i in range(acked)])
        t.verify = {"acked": acked, "not_listed": [], "unloadable": []}
        return t

    kill = 100.0
    lost = "engine worker w1 was lost while it held this request; retry it: ... restored from p"
    tenants = [
        tenant(0, [Op("train", 99.0, 99.5), Op("train", 100.2, 100.2, lost),
                   Op("train", 100.3, 101.5), Op("train", 101.5, 102.0)], 3),
        tenant(1, [Op("train", 99.5, 100.1), Op("train", 100.1, 100.4)], 2)]
    monitor = Monitor(server=None)  # type: ignore[arg-type]
    monitor.samples = [(99.0, {"w0": ["tenant-1"], "w1": ["tenant-0"]}),
                       (100.5, {"w0": ["tenant-0", "tenant-1"]}),
                       (104.0, {"w0": ["tenant-0", "tenant-1"], "w2": []})]
    out = summarize(tenants, monitor, kill, monitor.samples[0][1])
    assert out["affected_tenants"] == ["tenant-0"] and out["lost_lanes"] == ["w1"]
    assert out["recovery_s"] == pytest.approx(1.5)
    assert out["lane_gone_s"] == pytest.approx(0.5)
    assert out["replacement_joined_s"] == pytest.approx(4.0)
    assert out["unaffected_max_gap_s"] == pytest.approx(0.3)  # 100.1 → 100.4
    assert out["errors_name_restore"] and out["acknowledged_lost"] == 0
    assert out["acknowledged"] == 5


def test_goals_judge_each_key_and_tenants_beyond_the_budget() -> None:
    goals = goals_of({"throughput_ratio_2v1": 1.6, "acknowledged_lost": 0, "recovery_s": None,
                      "tenants_per_worker_max": 16, "paging": {"num_resident_budgeted": 4}})
    assert goals["throughput_ratio_2v1"]["pass"] is False
    assert goals["acknowledged_lost"]["pass"] is True
    assert goals["recovery_s"]["pass"] is False  # not measured is not a pass
    assert goals["tenants_per_worker_max"] == {"value": 16, "goal": [">", 4], "pass": True}


HEADLINE = ("throughput_ratio_2v1", "dispatch_overhead_ms", "page_swap_ms",
            "page_bytes_vs_theory", "recovery_s", "acknowledged_lost", "tenants_per_worker_max")


@pytest.mark.slow
def test_smoke_run_end_to_end_writes_json_md_png(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "benchmarks.scaleout", "--smoke", "--out",
                           str(tmp_path), "--scratch-dir", str(tmp_path / "scratch")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-4000:]
    record = Result.read(tmp_path / "scaleout.json")
    result = record.payload
    assert set(HEADLINE) <= set(result) and set(result["goals"]) == set(HEADLINE)
    for key in HEADLINE:
        assert isinstance(result[key], int | float), (key, result[key])
    assert result["smoke"] and result["settings"]["tenants"] == SMOKE.tenants
    assert {"commit", "loraplex_dirty"} <= set(result["git"])
    assert record.start.probe and {"load_avg_1m", "gemm_fwd_bwd_gflops"} <= set(
        record.start.probe)
    runs = result["throughput"]["runs"]
    assert [len(runs["1"]), len(runs["2"])] == [SMOKE.rounds] * 2
    for w in ("1", "2"):
        run = runs[w][0]
        assert run["workers"] == int(w) and run["aggregate_tok_s"] > 0
        assert len(run["lanes"]) == int(w) and len(run["worker_cpu_s"]) == int(w)
        assert run["cpu_s"]["engine_workers"] > 0 and run["cpu_s"]["server"] > 0
        assert {"probe_before", "probe_after", "load_avg"} <= set(run)
    dispatch = result["dispatch"]
    assert set(dispatch["calls"]) == {"cycle", "forward_backward", "optim_step", "empty"}
    assert dispatch["per_cycle_ms"] == dispatch["calls"]["cycle"]["diff_p50_ms"]
    assert dispatch["two_calls_ms"] == (dispatch["calls"]["forward_backward"]["diff_p50_ms"]
                                        + dispatch["calls"]["optim_step"]["diff_p50_ms"])
    assert dispatch["bare_call_ms"] == dispatch["calls"]["empty"]["diff_p50_ms"]
    paging = result["paging"]
    assert paging["disk"]["adapters_trained"] == 4 * SMOKE.paging_resident
    assert paging["disk"]["max_resident"] <= SMOKE.paging_resident
    assert paging["disk"]["paging"]["page_ins"] > 0
    recovery = result["recovery"]
    assert recovery["affected_tenants"] and recovery["lost_lanes"]
    assert recovery["victim_pid"] not in recovery["worker_pids_after"]
    assert len(recovery["tenants"]) == SMOKE.tenants
    md = (tmp_path / "scaleout.md").read_text()
    assert "| key | what | value | goal | verdict |" in md
    for heading in ("## Throughput", "### Where the time went", "## Dispatch", "## Paging",
                    "## Recovery"):
        assert heading in md
    assert "![throughput and recovery](scaleout.png)" in md
    png = (tmp_path / "scaleout.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert elapsed < 400, f"the smoke run took {elapsed:.0f} s"
