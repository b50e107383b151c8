"""Building scenarios from presets plus overrides, or from a full custom workload."""

from __future__ import annotations

import pytest

from loraplex.cost.calculator import compare
from loraplex.cost.presets import build_scenario, get_preset
from loraplex.errors import UserError


def test_overrides_apply_per_section() -> None:
    s = build_scenario("swe_rl", "seed-calibrated", {
        "workload": {"steps": 10}, "self_host": {"hardware": "h200"},
        "tinker_cached": {"cached_prefill_ratio": 0.2}})
    assert s.workload.steps == 10 and s.self_host.hardware == "h200"
    assert s.tinker_cached is not None and s.tinker_cached.cached_prefill_ratio == 0.2
    assert s.tinker_cached.cache_hits == "hit_rate"  # the rest of the preset's cache setup


def test_tinker_cached_false_drops_the_cached_bill() -> None:
    s = build_scenario("swe_rl", "seed-calibrated", {"tinker_cached": False})
    assert s.tinker_cached is None and compare(s).tinker_cached is None


def test_custom_workload_without_a_preset() -> None:
    s = build_scenario(None, "physical", {"workload": {
        "name": "mine", "model": "meta-llama/Llama-3.1-8B", "steps": 3, "groups_per_step": 4,
        "group_size": 2, "prompt_tokens": 100, "sample_tokens_per_turn": 50,
        "observation_tokens_per_turn": 0}})
    c = compare(s)
    assert c.scenario.workload.name == "mine" and c.tinker.total_usd > 0


def test_incomplete_custom_workload_and_unknown_sections() -> None:
    with pytest.raises(UserError, match="needs"):
        build_scenario(None, "physical", {"workload": {"name": "x"}})
    with pytest.raises(UserError, match="unknown sections"):
        build_scenario("math_rl", "physical", {"gpu": {}})
    with pytest.raises(UserError, match="unknown preset"):
        get_preset("chess_rl")
