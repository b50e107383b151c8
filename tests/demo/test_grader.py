"""The clamp grader: correct code passes, buggy code fails, unsafe code is refused, never run."""

from __future__ import annotations

import pytest

from loraplex.demo.clamp_task import (
    BUGGY_BODIES,
    CORRECT_BODIES,
    HELDOUT_FIXTURES,
    TRAIN_FIXTURES,
    solution_text,
)
from loraplex.demo.grader import grade, reward


@pytest.mark.parametrize("body", CORRECT_BODIES)
def test_correct_solutions_pass_train_and_heldout(body: str) -> None:
    src = solution_text(body)
    assert reward(src, TRAIN_FIXTURES) == 1.0
    assert reward(src, HELDOUT_FIXTURES) == 1.0


@pytest.mark.parametrize("body", BUGGY_BODIES)
def test_buggy_solutions_fail_train_fixtures(body: str) -> None:
    assert reward(solution_text(body), TRAIN_FIXTURES) == 0.0


def test_partial_credit_is_counted_but_reward_is_all_or_nothing() -> None:
    g = grade(solution_text("    return min(x, hi)"), TRAIN_FIXTURES)
    # min(x, hi) is right except below range (-1,0,2) and negative bounds (-4,-3,-1).
    assert (g.passed, g.total) == (5, 7)
    assert reward(solution_text("    return min(x, hi)"), TRAIN_FIXTURES) == 0.0


@pytest.mark.parametrize(
    "source",
    [
        "import os\ndef clamp(x, lo, hi):\n    return x",
        "def clamp(x, lo, hi):\n    while True:\n        pass",
        "def clamp(x, lo, hi):\n    return open('/etc/passwd').read()",
        "def clamp(x, lo, hi):\n    return __import__('os').system('true')",
        "def clamp(x, lo, hi):\n    return x.__class__",
        "def clamp(x, lo, hi):\n    return [x][0]",
        "def clamp(x, lo, hi):\n    return (lambda: x)()",
        "def clamp(x, lo, hi):\n    for i in range(10**9):\n        x = x\n    return x",
        "def clamp(x, lo, y):\n    return x",
        "def clamp(x, lo, hi:\n    return x",
        "def clamp(x, lo, hi):\n    return 1 // (x - x)",
        "",
    ],
)
def test_unsafe_or_broken_code_scores_zero_without_running(source: str) -> None:
    g = grade(source, TRAIN_FIXTURES)
    assert g.error is not None
    assert reward(source, TRAIN_FIXTURES) == 0.0


def test_booleans_do_not_count_as_integers() -> None:
    assert reward("def clamp(x, lo, hi):\n    return x > hi", ((3, 0, 2, 1),)) == 0.0


def test_markdown_fences_are_tolerated() -> None:
    src = "```python\n" + solution_text(CORRECT_BODIES[0]) + "\n```"
    assert reward(src, TRAIN_FIXTURES) == 1.0
