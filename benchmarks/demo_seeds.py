"""`loraplex demo` over seeds: the default run (the README's demo line) and its spread.

Runs the CLI exactly as the README does (`loraplex demo --out DIR --seed S`, default threads),
one seed after another, and records each run's pass rates (after the SFT warm start, after
GRPO, held-out), its `kl_sample_train` and wall time, with the load average and the GEMM probe.
The README's and docs' demo numbers are checked against this file (`scripts/check_numbers.py`).
Usage::

    python -m benchmarks.demo_seeds                # seeds 0-4, about 2.5 min each on 2 cores
    python -m benchmarks.demo_seeds --seeds 0 1
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import SCRATCH
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import pyplot, write
from benchmarks.probe import load_average

NAME = "demo_seeds"


def run_seed(seed: int, out: Path) -> dict[str, Any]:
    """One `loraplex demo` run; its summary plus the wall time and load around it."""
    load_before = load_average()[0]
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "loraplex", "demo", "--out", str(out), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed}: demo failed\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"seed": seed, "sft_pass_rate": summary["sft_pass_rate"],
            "final_pass_rate": summary["final_pass_rate"],
            "heldout_pass_rate": summary["heldout_pass_rate"],
            "rl_steps": len(summary["rl_pass_rate_by_step"]),
            "max_abs_kl_sample_train": summary["max_abs_kl_sample_train"],
            "sft_s": summary["sft_s"], "rl_s": summary["rl_s"],
            "wall_s": time.perf_counter() - t0, "load_before": load_before,
            "load_after": load_average()[0],
            "rl_pass_rate_by_step": summary["rl_pass_rate_by_step"]}


def markdown(record: Result) -> str:
    result = record.payload
    runs = result["runs"]
    lines = [
        "# `loraplex demo` over seeds", "",
        f"The default run (`loraplex demo --out DIR --seed S`), {runs[0]['rl_steps']} GRPO "
        f"steps. {record.provenance()}", "",
        "| seed | after SFT | after GRPO | held-out | max abs `kl_sample_train` | SFT s | GRPO s "
        "| load |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['sft_pass_rate']:.3f} | {r['final_pass_rate']:.3f} | "
              f"{r['heldout_pass_rate']:.3f} | {r['max_abs_kl_sample_train']} | {r['sft_s']:.0f} "
              f"| {r['rl_s']:.0f} | {r['load_before']:.1f}–{r['load_after']:.1f} |" for r in runs]
    lines += ["", f"Held-out mean {result['heldout_mean']:.3f}, min {result['heldout_min']:.3f}."]
    return "\n".join(lines) + "\n"


def figure(result: dict[str, Any]) -> Any:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in result["runs"]:
        ax.plot(run["rl_pass_rate_by_step"], label=f"seed {run['seed']}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("pass rate (rollouts)")
    ax.set_title("loraplex demo: GRPO pass rate per seed")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    record = Run(NAME)
    runs = []
    for i, seed in enumerate(args.seeds):
        print(f"[{i + 1}/{len(args.seeds)}] loraplex demo --seed {seed} ...", flush=True)
        run = run_seed(seed, SCRATCH / "demo_seeds" / f"seed-{seed}")
        print(f"    SFT {run['sft_pass_rate']:.3f} -> GRPO {run['final_pass_rate']:.3f} "
              f"(held-out {run['heldout_pass_rate']:.3f}) in {run['wall_s']:.0f} s", flush=True)
        runs.append(run)
    heldout = [r["heldout_pass_rate"] for r in runs]
    result = record.finish({"runs": runs, "heldout_mean": statistics.mean(heldout),
                            "heldout_min": min(heldout)}, model="tiny (loraplex demo's default)")
    write(result, markdown(result), args.out, figure=figure(result.payload))
    print(markdown(result))


if __name__ == "__main__":
    main()
