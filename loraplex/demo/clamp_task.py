"""The clamp task: prompts, fixtures and the SFT warm-start mix of correct and buggy solutions.

`clamp(x, lo, hi)` returns x inside the inclusive interval [lo, hi] and the nearest bound
otherwise (lo ≤ hi). Training fixtures cover below / inside / above range, a zero-width
interval and negative bounds; held-out fixtures are never shown in prompts nor used in rewards.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

Fixture = tuple[int, int, int, int]  # (x, lo, hi, expected)

TRAIN_FIXTURES: tuple[Fixture, ...] = (
    (-1, 0, 2, 0),  # below range
    (1, 0, 2, 1),  # inside range
    (3, 0, 2, 2),  # above range
    (3, 2, 2, 2),  # zero-width interval
    (-4, -3, -1, -3),  # negative bounds
    (0, 0, 2, 0),  # on the lower bound
    (2, 0, 2, 2),  # on the upper bound
)

HELDOUT_FIXTURES: tuple[Fixture, ...] = (
    (-10, -5, 5, -5),
    (7, -2, 3, 3),
    (4, -1, 9, 4),
    (-2, -2, -2, -2),
    (100, -50, 50, 50),
    (-8, -9, -7, -8),
    (0, 1, 1, 1),
    (6, 6, 8, 6),
)

SIGNATURE = "def clamp(x, lo, hi):"

CORRECT_BODIES: tuple[str, ...] = (
    "    return min(max(x, lo), hi)",
    "    return max(lo, min(x, hi))",
    "    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x",
)

BUGGY_BODIES: tuple[str, ...] = (
    "    return max(min(x, lo), hi)",
    "    return x",
    "    return min(x, hi)",
    "    return max(x, lo)",
    "    if x < lo:\n        return hi\n    if x > hi:\n        return lo\n    return x",
)

_PHRASINGS: tuple[str, ...] = (
    "Write a Python function clamp(x, lo, hi) that returns x when lo <= x <= hi, "
    "and the nearest bound otherwise.",
    "Implement clamp(x, lo, hi) in Python: keep x inside the inclusive range [lo, hi].",
    "Complete the Python function clamp(x, lo, hi). It limits x to the interval [lo, hi] "
    "(lo <= hi).",
    "Python task: clamp(x, lo, hi) must return lo if x is below lo, hi if x is above hi, "
    "else x.",
)


@dataclass(frozen=True)
class ClampPrompt:
    """One prompt variant: the user message and the fixtures it shows as examples."""

    prompt_id: int
    text: str
    shown: tuple[Fixture, ...]

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.text}]


def _format_examples(fixtures: tuple[Fixture, ...]) -> str:
    return "\n".join(f"clamp({x}, {lo}, {hi}) == {want}" for x, lo, hi, want in fixtures)


def build_prompts(num_prompts: int, seed: int) -> tuple[ClampPrompt, ...]:
    """Deterministic prompt variants: a phrasing plus 2–3 training fixtures as examples."""
    rng = random.Random(seed)
    prompts = []
    for i in range(num_prompts):
        phrasing = _PHRASINGS[i % len(_PHRASINGS)]
        shown = tuple(rng.sample(TRAIN_FIXTURES, k=2 + (i % 2)))
        text = f"{phrasing}\nExamples:\n{_format_examples(shown)}\nAnswer with only the code."
        prompts.append(ClampPrompt(i, text, shown))
    return tuple(prompts)


def solution_text(body: str) -> str:
    """A completion: the signature line, then the body."""
    return f"{SIGNATURE}\n{body}"


def sft_examples(
    prompts: tuple[ClampPrompt, ...], correct_fraction: float, seed: int
) -> list[tuple[ClampPrompt, str]]:
    """(prompt, completion) pairs: every prompt gets each correct body, plus buggy bodies in
    the ratio that makes `correct_fraction` of the pairs correct."""
    rng = random.Random(seed)
    pairs: list[tuple[ClampPrompt, str]] = []
    num_buggy = round(len(CORRECT_BODIES) * (1 - correct_fraction) / correct_fraction)
    for prompt in prompts:
        pairs += [(prompt, solution_text(b)) for b in CORRECT_BODIES]
        buggy = [BUGGY_BODIES[(prompt.prompt_id + j) % len(BUGGY_BODIES)] for j in range(num_buggy)]
        pairs += [(prompt, solution_text(b)) for b in buggy]
    rng.shuffle(pairs)
    return pairs
