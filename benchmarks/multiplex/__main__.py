"""Multiplexing benchmark: K tenant processes (official SDK) train against one `loraplex serve`
on the `small` model, packed vs naive time-slicing vs one adapter with the same total batch,
in SFT and GRPO loops; then loraplex side by side with SkyRL tx through the same client script.

    python -m benchmarks.multiplex [--quick] [--skip-skyrl] [--ks 1,2,4,8,16]

One run starts two servers on the same weights (default scheduler; ``--timeslice``) and a pool
of tenant worker processes (`multiplex/tenant.py`, SDK 0.38), then for each mode and K runs,
interleaved (order reversed every other K): ``packed`` (K tenants, packed server),
``timeslice`` (same tenants, timeslice server) and ``single`` (one tenant sending K× the batch,
packed server). Each run: warm-up steps, a barrier, ``timed_steps`` steps per tenant; tenants
that finish early keep stepping until all are done (steady load). Per run, from the tenants'
step timestamps, ``/api/v1/loraplex/stats`` deltas and /proc CPU counters: aggregate trained
tok/s, per-tenant tok/s, step latency, engine utilization, cycle packing, and the CPU share of
the tenant processes, the server and everything else on the machine. Load average and the GEMM
probe at start and end; `per_op_overhead_ms` from the no-op-engine scheduler benchmark.
Writes ``benchmarks/results/multiplex.{json,md,png}`` (`multiplex/report.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import traceback
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tqdm import tqdm

from benchmarks import RESULTS, SCRATCH
from benchmarks.harness import cli
from benchmarks.harness.result import Run, git_state
from benchmarks.harness.writer import write
from benchmarks.multiplex.pool import tenant_pool
from benchmarks.multiplex.run import MODEL_NAME, RunSpec, loraplex_server, run_loop
from benchmarks.multiplex.workload import Workload
from benchmarks.peers import skyrl
from benchmarks.peers.client import run_client
from benchmarks.peers.small_model import SMALL_MODEL_DIR, ensure_small_model

VARIANTS = ("packed", "timeslice", "single")
#: `per_op_overhead_ms` below; packed ÷ one-adapter `efficiency` at least (the plot's line).
GOALS = {"per_op_overhead_ms": 5.0, "efficiency": 0.9}


@dataclass(frozen=True)
class Settings:
    """What one benchmark run does (the markdown prints it).

    Attributes:
        ks: tenant counts.
        modes: ``sft`` and/or ``grpo``.
        workload: what each tenant does per step (its warm-up steps run before every run).
        timed_steps, min_window_tokens: timed steps per tenant: at least ``timed_steps``, and
            enough that the run's window holds ``min_window_tokens`` trained tokens (small K
            gets more steps, so every window is long enough to measure).
        grpo_timed_steps: the GRPO floor instead of ``timed_steps``. GRPO tenants fall into
            cohorts that share decode batches and train cycles; with 2 timed steps the
            cohort served first at the barrier looked 1.5× faster (fairness 1.49 at K=8), with
            8 steps the same server measured 1.08, so GRPO needs enough steps for the start-up
            offset to wash out.
        repeats: how many times each K's three runs are repeated (interleaved); ratios are
            the median over repeats.
        threads: torch threads of the multiplex servers. 1 by default: on a shared machine a
            2-thread OpenMP GEMM collapses 3–7× under contention (perf-anchors §4) while one
            thread degrades by its share, so ratios between runs minutes apart stay readable.
        peer_threads: torch threads of the loraplex server compared with SkyRL (its XLA
            uses every core). 1 by default for the reason above: with 2 threads on this shared
            machine loraplex's decode steps (many small ops) collapsed to ~1 tok/s.
        peer_args: client_bench.py arguments for the loraplex vs SkyRL comparison.
    """

    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    modes: tuple[str, ...] = ("sft", "grpo")
    workload: Workload = field(default_factory=Workload)
    timed_steps: int = 2
    grpo_timed_steps: int = 6
    min_window_tokens: int = 6144
    repeats: int = 2
    threads: int | None = 1
    peer_threads: int | None = 1
    peer_args: tuple[str, ...] = ("--steps", "2", "--warmup-steps", "1", "--rounds", "2",
                                  "--num-prompts", "4", "--fanout-samples", "4",
                                  "--max-tokens", "32")

    def run_spec(self, mode: str, k: int, variant: str) -> RunSpec:
        step_tokens = k * self.workload.tokens_per_step(mode)
        floor = self.timed_steps if mode == "sft" else self.grpo_timed_steps
        timed = max(floor, -(-self.min_window_tokens // step_tokens))
        return RunSpec(mode, k, variant, timed, self.workload)

    def payload(self) -> dict[str, Any]:
        """The settings as the result records them: the workload's fields among the rest."""
        fields = asdict(self)
        return {**fields.pop("workload"), **fields}


QUICK = Settings(ks=(1, 2, 4), workload=Workload(seq_len=64, max_tokens=8), timed_steps=2,
                 grpo_timed_steps=2, min_window_tokens=512, repeats=1,
                 peer_args=("--steps", "1", "--warmup-steps", "1", "--rounds", "1",
                            "--num-prompts", "2", "--fanout-samples", "2", "--max-tokens", "8",
                            "--train-lengths", "64,64,128,128"))


def derive(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per K: the packed run's numbers and its ratios to the other two, each the median over
    repeats of the ratio within one repeat (runs seconds apart, so shared load mostly
    cancels). ``*_cpu`` ratios use trained tokens per server CPU second instead of per wall
    second: what the work cost, whatever else ran on the machine."""

    def median(key: str, variant: str = "packed") -> float:
        return statistics.median(r[key] for r in runs[variant])

    def ratio(key: str, other: str) -> float:
        return statistics.median(p[key] / o[key] for p, o in zip(runs["packed"], runs[other],
                                                                 strict=True))

    packed = runs["packed"]
    return {
        "aggregate_tok_s": median("aggregate_tok_s"),
        "efficiency": ratio("aggregate_tok_s", "single"),
        "speedup_vs_timeslice": ratio("aggregate_tok_s", "timeslice"),
        "efficiency_cpu": ratio("tok_per_server_cpu_s", "single"),
        # Engine seconds per trained token, one adapter ÷ packed: the engine's share of the
        # efficiency (the rest is engine idle time: HTTP, scheduling, clients).
        "engine_efficiency": statistics.median(
            s["engine_s_per_ktok"] / p["engine_s_per_ktok"]
            for p, s in zip(runs["packed"], runs["single"], strict=True)),
        "speedup_vs_timeslice_cpu": ratio("tok_per_server_cpu_s", "timeslice"),
        "fairness": median("fairness"),
        "step_latency_s": {q: statistics.median(r["step_latency_s"][q] for r in packed)
                           for q in ("p50", "p95")},
        "utilization": median("utilization"),
        "client_cpu_share": median("client_cpu_share"),
        "server_cpu_share": median("server_cpu_share"),
        "other_cpu_share": median("other_cpu_share"),
        "sampled_tok_s": median("sampled_tok_s"),
    }


def multiplex_phase(settings: Settings, model_dir: Path, scratch: Path,
                    roofline_tok_s: float) -> dict[str, Any]:
    """Every mode × K × repeat × variant, interleaved (the variants' order flips every
    time); returns the per-mode rows."""
    out: dict[str, Any] = {}
    with ExitStack() as stack:
        servers = {
            "packed": stack.enter_context(loraplex_server(model_dir, scratch / "packed",
                                                          settings.threads)),
            "timeslice": stack.enter_context(loraplex_server(
                model_dir, scratch / "timeslice", settings.threads, "--timeslice"))}
        pool = tenant_pool(max(settings.ks), scratch / "tenant-logs")
        stack.callback(pool.close)
        total = settings.repeats * sum(
            settings.run_spec(mode, k, "packed").timed_steps * (2 * k + 1)
            for mode in settings.modes for k in settings.ks)
        bar = stack.enter_context(tqdm(total=total, desc="timed steps", unit="step"))
        flip = 0
        for mode in settings.modes:
            rows = []
            for k in settings.ks:
                runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
                for _ in range(settings.repeats):
                    flip += 1
                    for variant in VARIANTS if flip % 2 else VARIANTS[::-1]:
                        bar.set_postfix_str(f"{mode} K={k} {variant}")
                        server = servers["timeslice" if variant == "timeslice" else "packed"]
                        spec = settings.run_spec(mode, k, variant)
                        runs[variant].append(run_loop(pool, server, spec, bar))
                derived = derive(runs)
                derived["roofline_fraction"] = derived["aggregate_tok_s"] / roofline_tok_s
                rows.append({"k": k, **derived, "runs": runs})
                tqdm.write(f"{mode} K={k}: {json.dumps(_short(derived))}")
            out[mode] = rows
    return out


def _short(derived: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) for k, v in derived.items() if isinstance(v, float)}


def flops_per_trained_token(model_dir: Path) -> float:
    """LoRA training FLOPs per token with a frozen base: forward 2N + input-gradient 2N over
    every matmul weight the token passes (layers and the LM head), attention ignored."""
    c = json.loads((model_dir / "config.json").read_text())
    d, heads, kv, hd = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                        c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    attention = d * hd * (2 * heads + 2 * kv)
    mlp = 3 * d * c["intermediate_size"]
    return 4.0 * (c["num_hidden_layers"] * (attention + mlp) + d * c["vocab_size"])


def peer_phase(settings: Settings, model_dir: Path, scratch: Path, skyrl_dir: Path
               ) -> dict[str, Any]:
    """client_bench.py against loraplex (SDK 0.38) then SkyRL tx (SDK 0.25), same weights."""
    out: dict[str, Any] = {"client_args": list(settings.peer_args),
                           "loraplex_threads": settings.peer_threads}
    with loraplex_server(model_dir, scratch / "peer-loraplex", settings.peer_threads) as server:
        tqdm.write("peer: client_bench.py against loraplex")
        out["loraplex"] = run_client(sys.executable, server.base_url, MODEL_NAME,
                                     settings.peer_args, scratch / "peer-loraplex.json")
    try:
        tqdm.write(f"peer: installing/starting SkyRL tx under {skyrl_dir} (minutes)")
        out["skyrl"] = skyrl.measure(model_dir, settings.peer_args, skyrl_dir)
    except Exception as exc:
        out["status"] = "failed"
        out["reason"] = f"SkyRL tx could not be measured: {type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
        return out
    ours, theirs = out["loraplex"]["summary"], out["skyrl"]["summary"]
    out["status"] = "ok"
    out["ratio_vs_skyrl"] = {
        key: (ours[key] / theirs[key]) if ours.get(key) and theirs.get(key) else None
        for key in ("fwd_bwd_tok_s", "fwd_bwd_pipelined_tok_s", "sample_fanout_tok_s",
                    "sample_batch_tok_s")}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser(__doc__, out=False)
    p.add_argument("--quick", action="store_true", help="K=1,2,4, short sequences (smoke run)")
    p.add_argument("--skip-skyrl", action="store_true", help="no side-by-side with SkyRL tx")
    p.add_argument("--ks", help="comma-separated tenant counts (overrides the default)")
    p.add_argument("--modes", help="comma-separated: sft,grpo")
    p.add_argument("--timed-steps", type=int)
    p.add_argument("--repeats", type=int, help="repeats of each K's three runs")
    p.add_argument("--threads", type=int, help="multiplex servers' torch threads (default 1)")
    p.add_argument("--peer-threads", type=int,
                   help="torch threads of the loraplex server compared with SkyRL (default 1; "
                        "0: torch's default)")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results; "
                   "with --quick the scratch dir)")
    p.add_argument("--scratch-dir", type=Path, default=SCRATCH / "multiplex-bench")
    p.add_argument("--skyrl-dir", type=Path, default=skyrl.DEFAULT_SCRATCH_DIR,
                   help="SkyRL's venv + runs (installed there if missing)")
    p.add_argument("--model-dir", type=Path, default=SMALL_MODEL_DIR)
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    settings = cli.overridden(  # a flag of 0 or "" is not given
        QUICK if args.quick else Settings(), timed_steps=args.timed_steps or None,
        grpo_timed_steps=args.timed_steps or None, repeats=args.repeats or None,
        threads=args.threads or None,
        ks=tuple(int(k) for k in args.ks.split(",")) if args.ks else None,
        modes=tuple(args.modes.split(",")) if args.modes else None)
    if args.peer_threads is not None:
        settings = replace(settings, peer_threads=args.peer_threads or None)
    return settings


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # Imported after parsing, so that --help needs neither matplotlib nor the scheduler.
    from benchmarks.multiplex.report import figure, markdown
    from benchmarks.scheduler_overhead import per_op_overhead_ms

    settings = settings_from(args)
    # SIGTERM unwinds like Ctrl-C, so the servers and tenant processes are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model_dir = ensure_small_model(args.model_dir)
    run = Run("multiplex")
    probe_start = run.start.probe or {}
    flops = flops_per_trained_token(model_dir)
    roofline_tok_s = probe_start["gemm_fwd_bwd_gflops"] * 1e9 / flops
    tqdm.write(f"probe: {probe_start}; roofline {roofline_tok_s:.0f} trained tok/s")
    result: dict[str, Any] = {
        "quick": args.quick, "settings": settings.payload(), "model_dir": str(model_dir),
        "flops_per_trained_token": flops, "roofline_tok_s": roofline_tok_s,
        "cores": os.cpu_count(), "git": git_state(), "goals": GOALS,
        "per_op_overhead_ms": per_op_overhead_ms(16, 10 if args.quick else 50),
    }
    result["modes"] = multiplex_phase(settings, model_dir, args.scratch_dir, roofline_tok_s)
    if args.skip_skyrl:
        result["peer"] = {"status": "skipped", "reason": "--skip-skyrl"}
    else:
        result["peer"] = peer_phase(settings, model_dir, args.scratch_dir, args.skyrl_dir)
    record = run.finish(result, model=f"{MODEL_NAME} (loraplex's small built-in)")
    out = args.out or (args.scratch_dir if args.quick else RESULTS)
    write(record, markdown(record, "multiplex.png"), out,
          figure=figure(result, f"{record.start.at}, load avg {record.start.load_avg[0]:.1f}"))
    tqdm.write(f"wrote {out}/multiplex.{{json,md,png}} in {record.wall_s / 60:.1f} min")
    return result


if __name__ == "__main__":
    main()
