"""The whole demo against a running server: SFT warm start, pass-rate check, GRPO, final eval.

Only the official `tinker` SDK talks to the server. Progress bars and a per-step table go to the
console; metrics, manifest, summary and curves go to the output folder.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tinker
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loraplex.demo.clamp_task import HELDOUT_FIXTURES, TRAIN_FIXTURES, build_prompts
from loraplex.demo.config import DemoConfig
from loraplex.demo.evaluate import pass_rates
from loraplex.demo.grpo import grpo_step
from loraplex.demo.records import RunRecords
from loraplex.demo.rendering import Renderer
from loraplex.demo.sft import run_sft


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


def _manifest_header(cfg: DemoConfig, training: tinker.TrainingClient, renderer: Renderer) -> dict:
    info = training.get_info()
    return {
        "model_id": info.model_id,
        "base_model": cfg.base_model,
        "lora": {"rank": cfg.rank, "alpha": 32, "target_modules": ["attn", "mlp", "unembed"]},
        "tokenizer": info.model_data.tokenizer_id,
        "renderer": "tokenizer chat template (apply_chat_template), end token "
        f"{renderer.end_token}",
        "loss": {"sft": "cross_entropy", "rl": "importance_sampling", "config": {}},
        "optimizer": {"type": "adamw", "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                      "sft_learning_rate": cfg.sft_learning_rate,
                      "rl_learning_rate": cfg.rl_learning_rate},
        "config": asdict(cfg),
        "fixtures": {"train": TRAIN_FIXTURES, "heldout": HELDOUT_FIXTURES},
        "steps": [],
    }


def run_demo(base_url: str, api_key: str, cfg: DemoConfig, out_dir: Path,
             console: Console) -> dict[str, Any]:
    """Run the clamp story end to end; return the summary (also written to summary.json)."""
    t_start = time.perf_counter()
    records = RunRecords(out_dir)
    service = tinker.ServiceClient(base_url=base_url, api_key=api_key)
    training = service.create_lora_training_client(cfg.base_model, rank=cfg.rank,
                                                   seed=cfg.seed).result()
    renderer = Renderer.for_tokenizer(training.get_tokenizer())
    prompts = build_prompts(cfg.num_prompts, cfg.seed)
    records.manifest = _manifest_header(cfg, training, renderer)
    eval_params = tinker.SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                                        stop=[renderer.end_token], seed=cfg.seed + 7)
    with _progress(console) as progress:
        task = progress.add_task("SFT warm start", total=cfg.sft_steps)

        def on_sft_step(row: dict[str, Any]) -> None:
            records.log(row)
            progress.advance(task)

        run_sft(training, renderer, prompts, cfg, on_sft_step)
    sft_state = training.save_state("sft").result().path
    sft_sampler_path = training.save_weights_for_sampler("sft").result().path
    sft_sampler = service.create_sampling_client(model_path=sft_sampler_path).result()
    sft_pass, sft_heldout = pass_rates(sft_sampler, renderer, prompts,
                                       cfg.eval_samples_per_prompt, eval_params)
    console.print(f"after SFT: pass rate {sft_pass:.3f} (held-out {sft_heldout:.3f})")
    records.manifest["sft"] = {"state_path": sft_state, "sampler_path": sft_sampler_path,
                               "pass_rate": sft_pass, "heldout_pass_rate": sft_heldout}
    with _progress(console) as progress:
        task = progress.add_task("GRPO", total=cfg.rl_steps)
        for step in range(cfg.rl_steps):
            outcome = grpo_step(service, training, renderer, prompts, cfg, step)
            records.log(outcome.row)
            records.manifest["steps"].append({
                "step": step, "sampler_path": outcome.sampler_path,
                "trajectories": outcome.trajectories,
            })
            _print_rl_row(progress.console, outcome.row)
            progress.advance(task)
    final_state = training.save_state("final").result().path
    final_sampler_path = training.save_weights_for_sampler("final").result().path
    final_sampler = service.create_sampling_client(model_path=final_sampler_path).result()
    final_pass, final_heldout = pass_rates(final_sampler, renderer, prompts,
                                           cfg.eval_samples_per_prompt, eval_params)
    rl_rows = [r for r in records.rows if r["phase"] == "rl" and r["kl_sample_train"] is not None]
    summary = {
        "sft_pass_rate": sft_pass, "final_pass_rate": final_pass,
        "heldout_pass_rate": final_heldout, "sft_heldout_pass_rate": sft_heldout,
        "max_abs_kl_sample_train": max((abs(r["kl_sample_train"]) for r in rl_rows), default=None),
        "wall_s": time.perf_counter() - t_start,
        "final_state_path": final_state, "final_sampler_path": final_sampler_path,
    }
    records.manifest["final"] = summary
    records.write_json("manifest.json", records.manifest)
    records.write_json("summary.json", summary)
    records.plot_curves()
    service.close("success").result()
    return summary
