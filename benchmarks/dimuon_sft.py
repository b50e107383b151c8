"""Dimuon against AdamW: the demo's SFT warm start with each (``loraplex demo --optimizer X
--steps 1`` in a child process, as a user runs it, each at the demo's learning rate for it), and
the cost of one optimizer step on a SmolLM2-135M-shaped rank-32 adapter (30 layers, attention +
MLP targets), the two steps interleaved in one process.

Writes ``benchmarks/results/dimuon_sft.{json,md,png}`` (the loss curves, the pass rate after the
warm start, wall times, the step-time ratio, the load average and the GEMM probe). Usage::

    .venv/bin/python benchmarks/dimuon_sft.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import SCRATCH
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import pyplot, write
from loraplex.domain.optim import AdamParams, DimuonParams
from loraplex.engine.optim.adamw import adamw_step
from loraplex.engine.optim.dimuon import dimuon_step
from loraplex.engine.optim.optimizer_state import OptimizerState

OPTIMIZERS = ("adamw", "dimuon")
WORK = SCRATCH / "bench" / "dimuon_sft"
#: SmolLM2-135M: hidden 576, MLP 1536, 9 query / 3 KV heads of 64, 30 layers.
SHAPES = {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576),
          "gate": (1536, 576), "up": (1536, 576), "down": (576, 1536)}


def run_demo(optimizer: str) -> dict[str, Any]:
    out = WORK / optimizer
    cmd = [sys.executable, "-m", "loraplex", "demo", "--out", str(out), "--steps", "1",
           "--threads", "1", "--optimizer", optimizer]
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    return {"sft_loss": [r["loss"] for r in rows if r["phase"] == "sft"],
            "sft_pass_rate": summary["sft_pass_rate"], "sft_s": summary["sft_s"],
            "wall_s": wall, "params": manifest["optimizer"]["sft"]}


def adapter(rank: int = 32, layers: int = 30) -> tuple[list[str], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    names, tensors = [], []
    for target, (d_out, d_in) in SHAPES.items():
        names += [f"{target}.lora_A", f"{target}.lora_B"]
        tensors += [torch.randn(layers, rank, d_in, generator=gen),
                    torch.randn(layers, d_out, rank, generator=gen)]
    return names, tensors


def step_times(rounds: int = 7) -> dict[str, Any]:
    """Median seconds of one step of each optimizer, interleaved round by round."""
    torch.set_num_threads(1)
    names, params = adapter()
    grads = [torch.randn_like(p) for p in params]
    states = {"adamw": OptimizerState.zeros(names, params),
              "dimuon": OptimizerState.zeros(names, params, "dimuon")}
    times: dict[str, list[float]] = {"adamw": [], "dimuon": []}
    for _ in range(rounds):
        for name in OPTIMIZERS:
            g = [t.clone() for t in grads]
            t0 = time.perf_counter()
            if name == "adamw":
                adamw_step(params, g, states[name], AdamParams(learning_rate=1e-6))
            else:
                dimuon_step(params, g, states[name], DimuonParams(learning_rate=1e-6), 32)
            times[name].append(time.perf_counter() - t0)
    medians = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
    return {"median_s": medians, "dimuon_over_adamw": medians["dimuon"] / medians["adamw"],
            "num_params": sum(p.numel() for p in params), "threads": 1}


def figure(results: dict[str, Any]) -> Any:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in OPTIMIZERS:
        run = results["demo"][name]
        ax.plot(run["sft_loss"], label=f"{name} (lr {run['params']['learning_rate']:g})")
    ax.set_yscale("log")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("NLL per completion token")
    ax.set_title("Demo SFT warm start: Dimuon vs AdamW")
    ax.legend()
    fig.tight_layout()
    return fig


def markdown(record: Result) -> str:
    results = record.payload
    lines = ["# Dimuon vs AdamW", "", record.provenance(), "",
             "| optimizer | lr | loss step 0 / 10 / 50 / 100 / 200 | pass rate after SFT | SFT s |",
             "|---|---|---|---|---|"]
    for name in OPTIMIZERS:
        run = results["demo"][name]
        loss = run["sft_loss"]
        marks = " / ".join(f"{loss[i]:.3f}" for i in (0, 9, 49, 99, len(loss) - 1))
        lines.append(f"| {name} | {run['params']['learning_rate']:g} | {marks} | "
                     f"{run['sft_pass_rate']:.3f} | {run['sft_s']:.1f} |")
    steps = results["step"]
    lines += ["", f"One optimizer step on a SmolLM2-shaped rank-32 adapter "
              f"({steps['num_params'] / 1e6:.1f}M parameters, 1 thread): AdamW "
              f"{steps['median_s']['adamw'] * 1e3:.1f} ms, Dimuon "
              f"{steps['median_s']['dimuon'] * 1e3:.1f} ms, ratio "
              f"{steps['dimuon_over_adamw']:.2f}.", ""]
    return "\n".join(lines)


def main() -> None:
    args = cli.parser(__doc__).parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    run = Run("dimuon_sft")
    step = step_times()
    demo = {}
    for name in OPTIMIZERS:
        print(f"demo SFT with {name} ...", flush=True)
        demo[name] = run_demo(name)
        print(f"  final loss {demo[name]['sft_loss'][-1]:.4f}, pass rate "
              f"{demo[name]['sft_pass_rate']:.3f}", flush=True)
    result = run.finish({"step": step, "demo": demo}, model="tiny (loraplex demo's default)")
    write(result, markdown(result), args.out, figure=figure(result.payload))
    print(markdown(result))


if __name__ == "__main__":
    main()
