"""Workload shapes and typed overrides (the path CLI flags and TOML files take)."""

from __future__ import annotations

import pytest

from loraplex.cost.workloads import SelfHostSetup, TinkerSetup, Workload, override
from loraplex.errors import UserError

AGENT = Workload(name="agent", model="Qwen/Qwen3-8B", steps=2, groups_per_step=4, group_size=2,
                 turns=3, prompt_tokens=100, sample_tokens_per_turn=10,
                 observation_tokens_per_turn=40)


def test_contexts_grow_by_sample_plus_observation_each_turn() -> None:
    assert AGENT.contexts() == (100, 150, 200)
    assert AGENT.final_length == 210
    assert AGENT.rollouts_per_step == 8


def test_override_converts_command_line_strings() -> None:
    w = override(AGENT, {"steps": "5", "prompt_tokens": "2.5e3", "train_datums": "per_turn"},
                 "workload")
    assert (w.steps, w.prompt_tokens, w.train_datums) == (5, 2500.0, "per_turn")
    s = override(SelfHostSetup(), {"num_gpus": "16", "share_group_prompt": "false",
                                   "tensor_parallel": "none", "mode": "sync"}, "self_host")
    assert (s.num_gpus, s.share_group_prompt, s.tensor_parallel, s.mode) == (16, False, None,
                                                                             "sync")


def test_override_refuses_unknown_fields_and_bad_values() -> None:
    with pytest.raises(UserError, match=r"unknown keys \['stepz'\]"):
        override(AGENT, {"stepz": 3}, "workload")
    with pytest.raises(UserError, match=r"workload\.steps"):
        override(AGENT, {"steps": "many"}, "workload")
    with pytest.raises(UserError, match=r"workload\.steps"):
        override(AGENT, {"steps": 2.5}, "workload")
    with pytest.raises(UserError, match=r"tinker\.cache_hits"):
        override(TinkerSetup(), {"cache_hits": "all"}, "tinker")
    with pytest.raises(UserError, match="must be ≥ 1"):
        override(AGENT, {"turns": 0}, "workload")


def test_disaggregated_needs_a_trainer_pool() -> None:
    with pytest.raises(UserError, match="trainer_gpus"):
        SelfHostSetup(mode="disaggregated")
