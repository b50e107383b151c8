"""What the demo's SDK loop needs from a task: its prompts, its grader, its warm-start data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from loraplex.demo import arithmetic_task, clamp_task
from loraplex.demo.config import DemoConfig
from loraplex.demo.grader import reward


class TaskPrompt(Protocol):
    """A prompt: an id (seeds its samples) and the chat messages before the answer."""

    @property
    def prompt_id(self) -> int: ...

    @property
    def messages(self) -> list[dict[str, str]]: ...


@dataclass(frozen=True)
class DemoTask:
    """One task of the demo.

    Attributes:
        name: ``clamp`` or ``arithmetic``.
        eval_prompts: the prompts pass rates are measured on.
        rollout_prompts: step → the prompts GRPO samples groups of at that step.
        grade: (prompt, completion text) → (reward, held-out reward); the reward trains, the
            held-out one is only reported (clamp: the held-out fixtures; arithmetic: the same
            reward, the problems themselves being held out).
        sft_pairs: the warm-start (prompt, completion) pairs (empty: no warm start possible).
        score_name: what the first grade is called in the console ("pass rate", "reward").
    """

    name: str
    eval_prompts: tuple[TaskPrompt, ...]
    rollout_prompts: Callable[[int], tuple[TaskPrompt, ...]]
    grade: Callable[[TaskPrompt, str], tuple[float, float]]
    sft_pairs: Callable[[], list[tuple[TaskPrompt, str]]]
    score_name: str


def clamp_grade(_prompt: TaskPrompt, text: str) -> tuple[float, float]:
    return reward(text, clamp_task.TRAIN_FIXTURES), reward(text, clamp_task.HELDOUT_FIXTURES)


def arithmetic_grade(prompt: TaskPrompt, text: str) -> tuple[float, float]:
    assert isinstance(prompt, arithmetic_task.ArithmeticPrompt)
    score = arithmetic_task.arithmetic_reward(prompt, text)
    return score, score


def _cycle(prompts: tuple[TaskPrompt, ...], per_step: int) -> Callable[[int], tuple]:
    """Step s takes the next `per_step` prompts, wrapping around (all of them when equal)."""
    def at(step: int) -> tuple[TaskPrompt, ...]:
        return tuple(prompts[(step * per_step + i) % len(prompts)] for i in range(per_step))
    return at


def build_task(cfg: DemoConfig) -> DemoTask:
    if cfg.task == "clamp":
        prompts = clamp_task.build_prompts(cfg.num_prompts, cfg.seed)
        return DemoTask(
            "clamp", prompts, _cycle(prompts, cfg.prompts_per_step), clamp_grade,
            lambda: list(clamp_task.sft_examples(prompts, cfg.sft_correct_fraction, cfg.seed)),
            "pass rate")
    if cfg.task == "arithmetic":
        return DemoTask(
            "arithmetic", arithmetic_task.eval_problems(cfg.num_prompts, cfg.max_operand, cfg.seed),
            lambda step: arithmetic_task.rollout_problems(cfg.prompts_per_step, cfg.max_operand,
                                                          cfg.seed, step),
            arithmetic_grade, list, "reward")
    raise ValueError(f"unknown demo task {cfg.task!r}")
