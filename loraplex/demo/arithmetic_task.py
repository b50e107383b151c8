"""The arithmetic task: tinker-cookbook's ``math_rl`` ``env=arithmetic`` environment, reproduced.

"What is x + y?" with x, y drawn uniformly from 0..max_operand (the cookbook: 0..100), after the
cookbook's one-shot prefix (user "What is 4 + 5?", assistant "9"). Reward 1 when the completion's
last integer (commas dropped) is x + y, else 0 — the cookbook's ``check_answer``; its format term
is left out (``check_format`` is always true there, only a missing stop token costs 0.1).
Rollouts draw fresh problems every step, as the cookbook's dataset does; evaluation uses a fixed
set drawn from another seed, so its problems are held out from training (up to chance repeats).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

FEWSHOT: tuple[dict[str, str], ...] = (
    {"role": "user", "content": "What is 4 + 5?"},
    {"role": "assistant", "content": "9"},
)
_INTEGER = re.compile(r"-?\d+")
_EVAL_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class ArithmeticPrompt:
    """One addition problem."""

    prompt_id: int
    x: int
    y: int

    @property
    def text(self) -> str:
        return f"What is {self.x} + {self.y}?"

    @property
    def messages(self) -> list[dict[str, str]]:
        return [*FEWSHOT, {"role": "user", "content": self.text}]


def final_int(text: str) -> int | None:
    """The last integer in `text`, commas dropped (the cookbook's ``_extract_final_int``)."""
    found = _INTEGER.findall(text.replace(",", ""))
    return int(found[-1]) if found else None


def arithmetic_reward(prompt: ArithmeticPrompt, text: str) -> float:
    return 1.0 if final_int(text) == prompt.x + prompt.y else 0.0


def problems(count: int, max_operand: int, seed: int, first_id: int = 0
             ) -> tuple[ArithmeticPrompt, ...]:
    rng = random.Random(seed)
    return tuple(
        ArithmeticPrompt(first_id + i, rng.randint(0, max_operand), rng.randint(0, max_operand))
        for i in range(count)
    )


def rollout_problems(count: int, max_operand: int, seed: int, step: int
                     ) -> tuple[ArithmeticPrompt, ...]:
    """Step `step`'s fresh problems (ids unique across steps, so per-prompt seeds differ)."""
    return problems(count, max_operand, seed * 10_007 + step, first_id=step * count)


def eval_problems(count: int, max_operand: int, seed: int) -> tuple[ArithmeticPrompt, ...]:
    return problems(count, max_operand, seed + _EVAL_SEED_OFFSET, first_id=10**6)
