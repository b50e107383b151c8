"""A shortened real-model RL run: the demo's GRPO step (`grpo_step`, the same code as `loraplex
demo --model smollm2`) on the real SmolLM2-135M-Instruct, served in-process and driven by the
official SDK, raises the reward of the arithmetic task and keeps ``kl_sample_train`` exactly 0.

Two addition problems on which the base model is right 15-45 % of the time at temperature 1 (it
is right 1-5 % on the cookbook's 0..100 operands): five GRPO steps on them (G = 8, lr 1e-3; at
3e-3 the policy collapsed to 0.03 here) move its reward up by at least 0.2, measured before and
after on 32 fresh samples per problem. ~60 s on 2 cores. The full run (fresh problems every
step, held-out evaluation, and clamp with an SFT warm start) is `benchmarks/real_model_rl.py`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import tinker

from loraplex.cli.wheel_models import downloads_dir
from loraplex.demo.arithmetic_task import ArithmeticPrompt
from loraplex.demo.config import preset
from loraplex.demo.evaluate import pass_rates
from loraplex.demo.grpo import grpo_step
from loraplex.demo.rendering import Renderer
from loraplex.demo.task import DemoTask, arithmetic_grade
from tests.api.live_server import live_server
from tests.integration.test_smollm2_builtin import SERVED, served_context

PROBLEMS = (ArithmeticPrompt(0, 12, 5), ArithmeticPrompt(1, 9, 9))
RL_STEPS = 5
EVAL_SAMPLES = 32


def _linked_data_dir(session_dir: Path, target: Path) -> Path:
    """A fresh data dir whose downloads folder shares the session's fetched GGUF."""
    src, dst = downloads_dir(str(session_dir)), downloads_dir(str(target))
    dst.mkdir(parents=True)
    for gguf in src.glob("*.gguf"):
        os.link(gguf, dst / gguf.name)
    return target


@pytest.mark.slow
def test_grpo_raises_smollm2_arithmetic_reward(tmp_path: Path, smollm2_data_dir: Path) -> None:
    from transformers import AutoTokenizer

    from loraplex.cli.model_sources import resolve_source

    data_dir = _linked_data_dir(smollm2_data_dir, tmp_path / "data")
    renderer = Renderer.for_tokenizer(AutoTokenizer.from_pretrained(
        resolve_source("builtin:smollm2-135m", str(data_dir))))
    task = DemoTask("arithmetic", PROBLEMS, lambda step: PROBLEMS, arithmetic_grade, list,
                    "reward")
    cfg = replace(preset("smollm2", "arithmetic"), rl_steps=RL_STEPS, group_size=8,
                  prompts_per_step=len(PROBLEMS), rl_learning_rate=1e-3, max_tokens=8)
    params = tinker.SamplingParams(max_tokens=cfg.max_tokens, temperature=1.0,
                                   stop=[renderer.end_token], seed=11)
    ctx = served_context(data_dir)
    try:
        with live_server(ctx) as url:
            service = tinker.ServiceClient(base_url=url, api_key="tml-smollm2-grpo")
            base = service.create_sampling_client(base_model=SERVED).result()
            base_reward, _ = pass_rates(base, renderer, task, EVAL_SAMPLES, params)
            training = service.create_lora_training_client(SERVED, rank=cfg.rank, seed=0).result()
            rows = [grpo_step(service, training, renderer, task, cfg, step).row
                    for step in range(RL_STEPS)]
            final = service.create_sampling_client(
                model_path=training.save_weights_for_sampler("final").result().path).result()
            final_reward, _ = pass_rates(final, renderer, task, EVAL_SAMPLES, params)
    finally:
        ctx.stores.close()
    print(f"reward {base_reward:.3f} -> {final_reward:.3f}; rollouts",
          [round(r["pass_rate"], 3) for r in rows])  # shown by pytest -rP
    trained = [r for r in rows if r["loss"] is not None]
    assert trained, rows  # at least one step had a group with mixed rewards
    assert all(r["kl_sample_train"] == 0.0 for r in trained), rows
    assert 0.0 < base_reward < 0.6, base_reward
    assert final_reward >= base_reward + 0.2, (base_reward, final_reward, rows)
