"""One GRPO step through the SDK: fresh sampler checkpoint, G samples per prompt, grading,
group-centred advantages, importance_sampling forward_backward pipelined with optim_step.

Constant-reward groups (all pass or all fail) have zero advantage everywhere, so they carry no
gradient: they are filtered out before training and counted in the step's row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import tinker

from loraplex.demo.config import DemoConfig
from loraplex.demo.evaluate import Completion, sample_groups
from loraplex.demo.rendering import Renderer, rl_datum
from loraplex.demo.task import DemoTask, TaskPrompt


@dataclass(frozen=True)
class StepOutcome:
    """Metrics row plus the trajectories (for the manifest) of one GRPO step."""

    row: dict[str, Any]
    trajectories: list[dict[str, Any]]
    sampler_path: str


def grpo_step(
    service: tinker.ServiceClient, training: tinker.TrainingClient, renderer: Renderer,
    task: DemoTask, cfg: DemoConfig, step: int,
) -> StepOutcome:
    t0 = time.perf_counter()
    sampler_path = training.save_weights_for_sampler(f"rl-{step:04d}").result().path
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    params = tinker.SamplingParams(
        max_tokens=cfg.max_tokens, temperature=cfg.temperature,
        stop=[renderer.end_token], seed=cfg.seed * 100_003 + step,
    )
    prompts = task.rollout_prompts(step)
    groups = sample_groups(sampler, renderer, task, prompts, cfg.group_size, params)
    datums, kept, trajectories = _build_batch(renderer, prompts, groups, sampler_path, step)
    row: dict[str, Any] = {"phase": "rl", "step": step, "loss": None, "kl_sample_train": None}
    rewards = [c.reward for g in groups for c in g]
    row["pass_rate"] = sum(rewards) / len(rewards)
    row["heldout_pass_rate"] = sum(c.heldout_reward for g in groups for c in g) / len(rewards)
    row["group_mean"] = [sum(c.reward for c in g) / len(g) for g in groups]
    row["groups_kept"] = sum(1 for g in groups if len({c.reward for c in g}) > 1)
    row["groups_filtered"] = len(groups) - row["groups_kept"]
    num_tokens = sum(len(c.tokens) for g in groups for c in g)
    if datums:
        fwd_bwd = training.forward_backward(datums, "importance_sampling")
        optim = training.optim_step(cfg.optim_params("rl"))
        out = fwd_bwd.result()
        optim.result()
        row["loss"] = out.metrics["loss:sum"]
        row["kl_sample_train"] = _kl_sample_train(kept, out)
        num_tokens += sum(d.model_input.length for d in datums)
    row["tokens_per_s"] = num_tokens / (time.perf_counter() - t0)
    return StepOutcome(row, trajectories, sampler_path)


def _build_batch(
    renderer: Renderer, prompts: tuple[TaskPrompt, ...], groups: list[list[Completion]],
    sampler_path: str, step: int,
) -> tuple[list[tinker.Datum], list[Completion], list[dict[str, Any]]]:
    datums: list[tinker.Datum] = []
    kept: list[Completion] = []
    trajectories = []
    for prompt, group in zip(prompts, groups, strict=True):
        mean = sum(c.reward for c in group) / len(group)
        constant = all(c.reward == group[0].reward for c in group)
        prompt_tokens = renderer.prompt_tokens(prompt.messages)
        for c in group:
            advantage = c.reward - mean
            trajectories.append({
                "policy_version": sampler_path, "step": step, "prompt_id": c.prompt_id,
                "tokens": c.tokens, "reward": c.reward, "group_mean": mean,
                "advantage": advantage, "filtered": constant,
                "mask_tokens": 0 if constant else len(c.tokens),
            })
            if not constant:
                datums.append(rl_datum(prompt_tokens, c.tokens, c.logprobs, advantage))
                kept.append(c)
    return datums, kept, trajectories


def _kl_sample_train(kept: list[Completion], out: tinker.ForwardBackwardOutput) -> float:
    """Mean over sampled tokens of logp_sampler − logp_trainer (cookbook's kl_sample_train_v1)."""
    diffs: list[float] = []
    for c, output in zip(kept, out.loss_fn_outputs, strict=True):
        trainer = output["logprobs"].tolist()[-len(c.tokens):]
        diffs += [s - t for s, t in zip(c.logprobs, trainer, strict=True)]
    return sum(diffs) / max(len(diffs), 1)
