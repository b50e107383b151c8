"""The arithmetic task matches the cookbook's env (answer extraction, prompt, one-shot prefix),
and the demo's presets resolve as the CLI documents."""

from __future__ import annotations

import pytest

from loraplex.cli.demo_cmd import demo_config
from loraplex.demo.arithmetic_task import (
    FEWSHOT,
    ArithmeticPrompt,
    arithmetic_reward,
    eval_problems,
    final_int,
    rollout_problems,
)
from loraplex.demo.config import PRESETS, DemoConfig
from loraplex.demo.task import build_task


def test_last_integer_is_the_answer_commas_dropped() -> None:
    assert final_int("12 + 5 = 17") == 17
    assert final_int("The answer is 1,017.") == 1017
    assert final_int("minus: -3") == -3
    assert final_int("no number") is None


def test_reward_is_one_only_for_the_right_sum() -> None:
    p = ArithmeticPrompt(0, 12, 5)
    assert p.text == "What is 12 + 5?"
    assert p.messages == [*FEWSHOT, {"role": "user", "content": "What is 12 + 5?"}]
    assert [arithmetic_reward(p, t) for t in ("17", "12 + 5 = 17", "17 or 18", "", "7")] == [
        1.0, 1.0, 0.0, 0.0, 0.0]


def test_problems_are_deterministic_fresh_per_step_and_in_range() -> None:
    assert rollout_problems(6, 20, seed=0, step=3) == rollout_problems(6, 20, seed=0, step=3)
    step0, step1 = rollout_problems(6, 20, 0, 0), rollout_problems(6, 20, 0, 1)
    assert step0 != step1 and {p.prompt_id for p in step0}.isdisjoint(p.prompt_id for p in step1)
    held = eval_problems(32, 20, seed=0)
    assert len(held) == 32 and all(0 <= p.x <= 20 and 0 <= p.y <= 20 for p in held)
    assert {p.prompt_id for p in held}.isdisjoint(p.prompt_id for p in step0)


def test_presets_resolve_and_sources_run_the_tiny_preset() -> None:
    assert demo_config("tiny", "clamp", seed=0) == DemoConfig()
    smollm2 = demo_config("smollm2", "arithmetic", seed=3)
    assert (smollm2.model_source, smollm2.sft_steps, smollm2.seed) == (
        "builtin:smollm2-135m", 0, 3)
    other = demo_config("builtin:small", "clamp", seed=0)
    assert other.model_source == "builtin:small" and other.rl_steps == DemoConfig().rl_steps
    with pytest.raises(ValueError, match="no demo preset for --model tiny --task arithmetic"):
        demo_config("tiny", "arithmetic", seed=0)


def test_every_preset_builds_its_task() -> None:
    for (_, task_name), cfg in PRESETS.items():
        task = build_task(cfg)
        assert task.name == task_name and len(task.eval_prompts) == cfg.num_prompts
        assert len(task.rollout_prompts(5)) == cfg.prompts_per_step
        assert bool(task.sft_pairs()) == (task_name == "clamp")
