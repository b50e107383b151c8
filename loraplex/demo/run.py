"""The whole demo against a running server: the base model's pass rate (when asked), SFT warm
start (when the task has one), pass-rate check, GRPO, final eval.

Only the official `tinker` SDK talks to the server. Progress bars and a per-step table go to the
console; metrics, manifest, summary and curves go to the output folder.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tinker
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loraplex.demo.arithmetic_task import ArithmeticPrompt
from loraplex.demo.clamp_task import HELDOUT_FIXTURES, TRAIN_FIXTURES
from loraplex.demo.config import DemoConfig
from loraplex.demo.evaluate import pass_rates
from loraplex.demo.grpo import grpo_step
from loraplex.demo.records import RunRecords
from loraplex.demo.rendering import Renderer
from loraplex.demo.sft import run_sft
from loraplex.demo.task import DemoTask, build_task


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console,
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _print_rl_row(console: Console, row: dict[str, Any]) -> None:
    group_mean = sum(row["group_mean"]) / len(row["group_mean"])
    console.print(
        f"rl step {row['step']:>3}  loss {_fmt(row['loss']):>10}  pass {row['pass_rate']:.3f}  "
        f"group mean {group_mean:.3f}  kl(sample‖train) {_fmt(row['kl_sample_train']):>9}  "
        f"kept {row['groups_kept']}/{row['groups_kept'] + row['groups_filtered']}  "
        f"{row['tokens_per_s']:.0f} tok/s"
    )


def _manifest_header(ctx: _Run) -> dict:
    cfg, renderer = ctx.cfg, ctx.renderer
    info = ctx.training.get_info()
    fixtures = ({"train": TRAIN_FIXTURES, "heldout": HELDOUT_FIXTURES} if cfg.task == "clamp"
                else {"eval_problems": [[p.x, p.y] for p in ctx.task.eval_prompts
                                        if isinstance(p, ArithmeticPrompt)]})
    return {
        "model_id": info.model_id,
        "base_model": cfg.base_model,
        "lora": {"rank": cfg.rank, "alpha": 32, "target_modules": ["attn", "mlp", "unembed"]},
        "tokenizer": info.model_data.tokenizer_id,
        "renderer": "tokenizer chat template (apply_chat_template), end token "
        f"{renderer.end_token}",
        "loss": {"sft": "cross_entropy", "rl": "importance_sampling", "config": {}},
        "optimizer": {"type": cfg.optimizer,
                      "sft": cfg.optim_params("sft").model_dump(),
                      "rl": cfg.optim_params("rl").model_dump()},
        "config": asdict(cfg),
        "task": cfg.task,
        "fixtures": fixtures,
        "steps": [],
    }


def _evaluate(label: str, sampler: tinker.SamplingClient, ctx: _Run) -> dict[str, float]:
    score, heldout = pass_rates(sampler, ctx.renderer, ctx.task, ctx.cfg.eval_samples_per_prompt,
                                ctx.eval_params)
    name = ctx.task.score_name
    extra = f" (held-out {heldout:.3f})" if ctx.task.name == "clamp" else ""
    ctx.console.print(f"{label}: {name} {score:.3f}{extra}")
    return {"pass_rate": score, "heldout_pass_rate": heldout}


def _checkpoint_eval(label: str, name: str, ctx: _Run) -> dict[str, Any]:
    """Save state and sampler weights under `name`, and measure the pass rates there."""
    state = ctx.training.save_state(name).result().path
    sampler_path = ctx.training.save_weights_for_sampler(name).result().path
    sampler = ctx.service.create_sampling_client(model_path=sampler_path).result()
    return {"state_path": state, "sampler_path": sampler_path, **_evaluate(label, sampler, ctx)}


def _sft_phase(ctx: _Run) -> None:
    with _progress(ctx.console) as progress:
        bar = progress.add_task("SFT warm start", total=ctx.cfg.sft_steps)

        def on_sft_step(row: dict[str, Any]) -> None:
            ctx.records.log(row)
            progress.advance(bar)

        run_sft(ctx.training, ctx.renderer, ctx.task, ctx.cfg, on_sft_step)


def _rl_phase(ctx: _Run) -> None:
    with _progress(ctx.console) as progress:
        bar = progress.add_task("GRPO", total=ctx.cfg.rl_steps)
        for step in range(ctx.cfg.rl_steps):
            outcome = grpo_step(ctx.service, ctx.training, ctx.renderer, ctx.task, ctx.cfg, step)
            ctx.records.log(outcome.row)
            ctx.records.manifest["steps"].append({
                "step": step, "sampler_path": outcome.sampler_path,
                "trajectories": outcome.trajectories,
            })
            _print_rl_row(progress.console, outcome.row)
            progress.advance(bar)


@dataclass(frozen=True)
class _Run:
    """What every phase of one run shares."""

    cfg: DemoConfig
    task: DemoTask
    service: tinker.ServiceClient
    training: tinker.TrainingClient
    renderer: Renderer
    records: RunRecords
    console: Console
    eval_params: tinker.SamplingParams


def _start(base_url: str, api_key: str, cfg: DemoConfig, out_dir: Path,
           console: Console) -> _Run:
    service = tinker.ServiceClient(base_url=base_url, api_key=api_key)
    training = service.create_lora_training_client(cfg.base_model, rank=cfg.rank, seed=cfg.seed,
                                                   optimizer=cfg.optimizer_config()).result()
    renderer = Renderer.for_tokenizer(training.get_tokenizer())
    eval_params = tinker.SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                                        stop=[renderer.end_token], seed=cfg.seed + 7)
    ctx = _Run(cfg, build_task(cfg), service, training, renderer, RunRecords(out_dir), console,
               eval_params)
    ctx.records.manifest = _manifest_header(ctx)
    return ctx


def run_demo(base_url: str, api_key: str, cfg: DemoConfig, out_dir: Path,
             console: Console) -> dict[str, Any]:
    """Run the story end to end (base eval, SFT warm start, GRPO, final eval, each where the
    config asks for it); return the summary (also written to summary.json)."""
    t_start = time.perf_counter()
    ctx = _start(base_url, api_key, cfg, out_dir, console)
    walls: dict[str, float] = {}
    phases: dict[str, dict[str, Any]] = {}
    if cfg.eval_base:
        t0 = time.perf_counter()
        base = ctx.service.create_sampling_client(base_model=cfg.base_model).result()
        phases["base"] = _evaluate("base model", base, ctx)
        walls["base_eval_s"] = time.perf_counter() - t0
    if cfg.sft_steps > 0:
        t0 = time.perf_counter()
        _sft_phase(ctx)
        phases["sft"] = _checkpoint_eval("after SFT", "sft", ctx)
        walls["sft_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _rl_phase(ctx)
    phases["final"] = _checkpoint_eval(f"after {cfg.rl_steps} GRPO steps", "final", ctx)
    walls["rl_s"] = time.perf_counter() - t0
    summary = _summary(ctx, phases, {**walls, "wall_s": time.perf_counter() - t_start})
    ctx.records.manifest.update(phases)
    ctx.records.manifest["final"] = summary
    ctx.records.write_json("manifest.json", ctx.records.manifest)
    ctx.records.write_json("summary.json", summary)
    ctx.records.plot_curves()
    ctx.service.close("success").result()
    return summary


def _summary(ctx: _Run, phases: dict[str, dict[str, Any]], walls: dict[str, float]
             ) -> dict[str, Any]:
    rl_rows = [r for r in ctx.records.rows if r["phase"] == "rl"]
    kls = [abs(r["kl_sample_train"]) for r in rl_rows if r["kl_sample_train"] is not None]
    base, sft, final = phases.get("base", {}), phases.get("sft", {}), phases["final"]
    return {
        "task": ctx.task.name, "base_model": ctx.cfg.base_model,
        "base_pass_rate": base.get("pass_rate"),
        "base_heldout_pass_rate": base.get("heldout_pass_rate"),
        "sft_pass_rate": sft.get("pass_rate"),
        "sft_heldout_pass_rate": sft.get("heldout_pass_rate"),
        "final_pass_rate": final["pass_rate"], "heldout_pass_rate": final["heldout_pass_rate"],
        "rl_pass_rate_by_step": [r["pass_rate"] for r in rl_rows],
        "max_abs_kl_sample_train": max(kls, default=None),
        **walls,
        "final_state_path": final["state_path"], "final_sampler_path": final["sampler_path"],
    }
