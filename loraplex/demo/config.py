"""Settings of one demo run, built once by the CLI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DemoConfig:
    """Hyper-parameters of the clamp demo.

    Attributes:
        base_model: catalogue name the server serves the built-in model under.
        rank: LoRA rank (attention, MLP and unembed all trained).
        seed: seeds prompts, the SFT shuffle, adapter init and sampling.
        num_prompts: prompt variants (phrasings × shown fixtures).
        sft_correct_fraction: share of correct solutions in the warm-start mix.
        sft_steps: SFT optimizer steps; each is one pass over `sft_batch` examples.
        sft_batch: examples per SFT step.
        sft_learning_rate: AdamW learning rate during SFT.
        rl_steps: GRPO steps.
        prompts_per_step: groups per GRPO step.
        group_size: completions per prompt (G).
        rl_learning_rate: AdamW learning rate during GRPO.
        temperature: sampling temperature for rollouts and evaluation.
        max_tokens: completion budget.
        eval_samples_per_prompt: completions per prompt when measuring pass rates.
    """

    base_model: str = "Qwen/Qwen3-8B"
    rank: int = 32
    seed: int = 0
    num_prompts: int = 8
    sft_correct_fraction: float = 0.5
    sft_steps: int = 200
    sft_batch: int = 16
    sft_learning_rate: float = 5e-3
    rl_steps: int = 50
    prompts_per_step: int = 8
    group_size: int = 8
    rl_learning_rate: float = 5e-4
    temperature: float = 1.0
    max_tokens: int = 48
    eval_samples_per_prompt: int = 32
