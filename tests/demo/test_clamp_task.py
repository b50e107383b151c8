"""Prompts and the SFT mix of the clamp task."""

from __future__ import annotations

from loraplex.demo.clamp_task import (
    HELDOUT_FIXTURES,
    TRAIN_FIXTURES,
    build_prompts,
    sft_examples,
)
from loraplex.demo.grader import reward


def test_fixtures_match_the_issue_examples_and_heldout_is_disjoint() -> None:
    for fixture in [(-1, 0, 2, 0), (1, 0, 2, 1), (3, 0, 2, 2), (3, 2, 2, 2), (-4, -3, -1, -3)]:
        assert fixture in TRAIN_FIXTURES
    assert not set(TRAIN_FIXTURES) & set(HELDOUT_FIXTURES)
    for x, lo, hi, want in TRAIN_FIXTURES + HELDOUT_FIXTURES:
        assert lo <= hi and want == min(max(x, lo), hi)


def test_prompts_never_show_heldout_fixtures_and_are_deterministic() -> None:
    prompts = build_prompts(8, seed=3)
    assert prompts == build_prompts(8, seed=3)
    for p in prompts:
        assert all(f in TRAIN_FIXTURES for f in p.shown)
        for x, lo, hi, _ in HELDOUT_FIXTURES:
            assert f"clamp({x}, {lo}, {hi})" not in p.text


def test_sft_mix_is_about_half_correct() -> None:
    pairs = sft_examples(build_prompts(8, seed=0), correct_fraction=0.5, seed=0)
    correct = sum(reward(c, TRAIN_FIXTURES) for _, c in pairs)
    assert correct / len(pairs) == 0.5
