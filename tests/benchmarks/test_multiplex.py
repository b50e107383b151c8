"""The multiplex benchmark's arithmetic and its tenants' data: run sizes, the GRPO datums, the
measured window (which steps count, engine time clipped to it, fairness), the per-K ratios;
and one tiny run end to end against a real server process with two tenant processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tinker import types
from tqdm import tqdm

from benchmarks.harness.result import read_payload
from benchmarks.harness.server_process import serve_fake
from benchmarks.multiplex.__main__ import Settings, derive
from benchmarks.multiplex.pool import tenant_pool
from benchmarks.multiplex.report import figure
from benchmarks.multiplex.run import RunSpec, Snapshot, run_loop, summarize
from benchmarks.multiplex.tenant import GrpoLoop, Job
from benchmarks.multiplex.workload import Workload
from loraplex.config import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[2]


def test_small_k_gets_more_timed_steps_and_single_sends_k_times_the_batch() -> None:
    settings = Settings(workload=Workload(sft_batch=2, seq_len=128), timed_steps=2,
                        min_window_tokens=3072)
    one, sixteen = settings.run_spec("sft", 1, "packed"), settings.run_spec("sft", 16, "packed")
    assert (one.timed_steps, sixteen.timed_steps) == (12, 2)  # 12 × 256 ≥ 3072; at least 2
    assert settings.run_spec("grpo", 16, "packed").timed_steps == 6  # GRPO's own floor
    single = settings.run_spec("sft", 16, "single")
    assert single.num_tenants == 1 and single.timed_steps == sixteen.timed_steps
    assert single.tenant_job("http://h:1", "m", 0, "x")["batch"] == 32
    job = sixteen.tenant_job("http://h:1", "m", 5, "x")
    assert (job["batch"], job["seed"], job["timed_steps"]) == (2, 5, 2)
    assert settings.workload.tokens_per_step("grpo") == 1 * 4 * (48 + 16 - 1)


def test_grpo_datum_scores_only_the_completion() -> None:
    job = Job("http://h", "m", "tml-k", "grpo", batch=1)
    loop = GrpoLoop(tc=None, types=types, job=job)
    datum = loop._datum([5, 6, 7], [8, 9], [-0.5, -0.25], advantage=0.75)
    assert datum.model_input.to_ints() == [5, 6, 7, 8]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [6, 7, 8, 9]
    assert datum.loss_fn_inputs["logprobs"].tolist() == [0.0, 0.0, -0.5, -0.25]
    assert datum.loss_fn_inputs["advantages"].tolist() == [0.0, 0.0, 0.75, 0.75]


def _snapshot(t: float, engine_s: float, cpu_s: float, cycles: list[dict[str, Any]]
              ) -> Snapshot:
    stats = {"engine_s": {"cycle": engine_s}, "engine_calls": {"cycle": len(cycles)},
             "schedulers": [{"idle_s": 0.0, "overhead_s": 0.0, "recent_cycles": cycles}]}
    return Snapshot(t, stats, tenants_cpu_s=cpu_s / 10, server_cpu_s=cpu_s,
                    machine_busy_s=2 * cpu_s, machine_total_s=2 * t)


def _cycle(at: float, engine_s: float, tenants: list[str]) -> dict[str, Any]:
    """A cycle record as the benchmark's observer key (a tenant, not an operator) reads it:
    other tenants' ids hidden, their count in ``num_tenants``."""
    return {"kind": "cycle", "wall_time": at, "engine_s": engine_s, "num_tokens": 100,
            "tenants": [], "num_tenants": len(tenants)}


def test_window_counts_steps_finished_in_it_and_clips_engine_time() -> None:
    spec = RunSpec("sft", 2, "packed", timed_steps=1, workload=Workload(sft_batch=1))
    steps = [  # tenant 1 finishes its timed step at 110; tenant 0 fits an untimed one before
        {"worker": 0, "t0": 100.0, "t1": 104.0, "timed": True, "trained_tokens": 40,
         "sampled_tokens": 0},
        {"worker": 0, "t0": 104.0, "t1": 108.0, "timed": False, "trained_tokens": 40,
         "sampled_tokens": 0},
        {"worker": 1, "t0": 100.0, "t1": 110.0, "timed": True, "trained_tokens": 40,
         "sampled_tokens": 0},
        {"worker": 0, "t0": 108.0, "t1": 112.0, "timed": False, "trained_tokens": 40,
         "sampled_tokens": 0},
    ]
    cycles = [_cycle(95.0, 10.0, ["a"]), _cycle(105.0, 10.0, ["a", "b"])]
    before = _snapshot(100.0, 0.0, 0.0, [])
    after = _snapshot(110.0, 20.0, 5.0, cycles)
    run = summarize(spec, steps, {0: 104.0, 1: 110.0}, 100.0, before, after, (1.0, 1.0, 1.0))
    assert run["window_s"] == 10.0
    assert run["aggregate_tok_s"] == pytest.approx(120 / 10)  # the step ending at 112 is out
    assert run["utilization"] == pytest.approx((5.0 + 5.0) / 10)  # both cycles clipped
    assert run["fairness"] == pytest.approx((40 / 4) / (40 / 10))
    assert run["train_cycles"]["count"] == 1 and run["train_cycles"]["mean_tenants"] == 2
    assert run["tok_per_server_cpu_s"] == pytest.approx(120 / 5.0)


def test_ratios_are_medians_of_per_repeat_ratios() -> None:
    def run(tok_s: float) -> dict[str, Any]:
        return {"aggregate_tok_s": tok_s, "tok_per_server_cpu_s": tok_s,
                "engine_s_per_ktok": 1000 / tok_s, "fairness": 1.0, "utilization": 1.0,
                "client_cpu_share": 0.0, "server_cpu_share": 0.5, "other_cpu_share": 0.5,
                "sampled_tok_s": 0.0, "step_latency_s": {"p50": 1.0, "p95": 2.0}}

    derived = derive({"packed": [run(100), run(300), run(90)],
                      "timeslice": [run(50), run(300), run(100)],
                      "single": [run(100), run(100), run(100)]})
    assert derived["aggregate_tok_s"] == 100
    assert derived["speedup_vs_timeslice"] == pytest.approx(1.0)  # ratios 2, 1, 0.9
    assert derived["efficiency"] == pytest.approx(1.0)  # ratios 1, 3, 0.9
    assert derived["engine_efficiency"] == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["sft", "grpo"])
def test_a_run_end_to_end_with_two_tenant_processes(tmp_path: Path, mode: str) -> None:
    process = serve_fake(DEFAULT_MODEL_NAME, tmp_path / "data", "--executor", "toy",
                         timeout_s=120)
    pool = None
    try:
        pool = tenant_pool(2, tmp_path / "tenants")
        settings = Settings(workload=Workload(seq_len=8, prompt_len=6, max_tokens=3,
                                              vocab_limit=64), timed_steps=2, min_window_tokens=0)
        with tqdm(disable=True) as bar:
            run = run_loop(pool, process, settings.run_spec(mode, 2, "packed"), bar)
    finally:
        if pool is not None:
            pool.close()
        process.stop()
    assert run["num_tenants"] == 2 and len(run["tenants"]) == 2
    assert run["steps_in_window"] >= 4 and run["aggregate_tok_s"] > 0
    assert (run["sampled_tok_s"] > 0) == (mode == "grpo")
    assert run["train_cycles"]["count"] >= 2


@pytest.mark.parametrize("ks", [(1, 2, 4, 8, 16), (2, 4, 8)])
def test_plot_labels_k_as_plain_numbers(ks: tuple[int, ...]) -> None:
    import matplotlib.pyplot as plt

    result = read_payload(REPO / "benchmarks" / "results" / "multiplex.json")
    for mode, rows in result["modes"].items():
        result["modes"][mode] = [r for r in rows if r["k"] in ks]
    fig = figure(result)
    fig.canvas.draw()
    try:
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in ks]
            assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
            assert all(t.get_text().replace(".", "").isdigit() for t in ax.get_yticklabels())
    finally:
        plt.close(fig)
