"""Both bills of a scenario against numbers worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from loraplex.cost.calculator import compare, self_hosted_cost, tinker_cost, tinker_rollout_usage
from loraplex.cost.presets import get_preset
from loraplex.cost.workloads import SelfHostSetup, TinkerSetup, Workload

# swe_rl, seed-calibrated: c_t = 2,500 + (t-1)·(400 + 1,403) for t = 1..25.
SWE = get_preset("swe_rl").workload
P_SWE = 25 * 2500 + 1803 * (24 * 25 / 2)  # 603,400 prompt tokens per rollout
D_SWE = 25 * 400
L_SWE = 2500 + 25 * 400 + 24 * 1403  # 46,172


def test_tinker_bills_the_whole_history_every_turn() -> None:
    usage = tinker_rollout_usage(SWE, TinkerSetup())
    assert (usage.prefill_tokens, usage.sampled_tokens, usage.trained_tokens) == (
        P_SWE, D_SWE, L_SWE)
    bill = tinker_cost(SWE, TinkerSetup(), lora_rank=32).bill
    rollouts = 200 * 512
    assert bill.prefill_usd == pytest.approx(0.49 * P_SWE * rollouts / 1e6)
    assert bill.total_usd == pytest.approx(
        (0.49 * P_SWE + 1.47 * D_SWE + 1.47 * L_SWE) * rollouts / 1e6)
    assert bill.total_usd == pytest.approx(38_731.7, abs=1)


def test_tinker_cache_scenarios() -> None:
    hit92 = tinker_rollout_usage(SWE, TinkerSetup(cache_hits="hit_rate"))
    assert hit92.cache_hit_tokens == pytest.approx(0.92 * P_SWE)
    new_only = tinker_rollout_usage(SWE, TinkerSetup(cache_hits="new_tokens"))
    # Never seen before: the group prompt once per group of 8, and 24 observations.
    assert new_only.cache_hit_tokens == pytest.approx(P_SWE - (2500 / 8 + 24 * 1403))
    sampled = tinker_rollout_usage(SWE, TinkerSetup(train_token_basis="sampled_only"))
    assert sampled.trained_tokens == D_SWE


def test_per_turn_datums_repeat_the_history_in_training() -> None:
    w = dataclasses.replace(SWE, train_datums="per_turn")
    assert tinker_rollout_usage(w, TinkerSetup()).trained_tokens == P_SWE + D_SWE


def test_later_sheet_rule_bills_cache_hits_at_20_percent() -> None:
    w = dataclasses.replace(SWE, model="Qwen/Qwen3-8B")
    setup = TinkerSetup(cache_hits="new_tokens", billing_mode="cache_aware",
                        cached_prefill_ratio=0.2)
    bill = tinker_cost(w, setup, lora_rank=32).bill
    hits = P_SWE - (2500 / 8 + 24 * 1403)
    assert bill.cached_prefill_usd == pytest.approx(0.13 * 0.2 * hits * 200 * 512 / 1e6)
    assert bill.prefill_usd == pytest.approx(0.13 * (P_SWE - hits) * 200 * 512 / 1e6)


def test_self_hosted_math_rl_by_hand() -> None:
    # Qwen3-8B on 8 × H100 (8 replicas), 1,024 rollouts of 241 + 512 tokens, LoRA r=32.
    n = 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 4096 * 151936
    attn = 36 * 2 * 32 * 256
    widths = 36 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 12288) * 3) + 4096 + 151936
    adapter = 2 * 32 * widths
    prefill = ((2 * n + adapter) * 241 + attn * 241**2 / 2) / 16 * 1024
    train = ((4 * n + 3 * adapter) * 753 + 3 * attn * 753**2 / 2) * 1024
    t_pf = prefill / (8 * 989e12 * 0.5)
    t_dw = 512 * n * 2 / (3.35e12 * 0.7)
    t_kv = 1024 * 147456 * (512 * 241 + 512**2 / 2) / (8 * 3.35e12 * 0.7)
    t_tr = train / (8 * 989e12 * 0.4)
    wall = t_pf + t_dw + t_kv + t_tr + 12.9  # no environment: training is not hidden
    result = self_hosted_cost(get_preset("math_rl").workload, get_preset("math_rl").self_host)
    assert result.phases.prefill_s == pytest.approx(t_pf)
    assert result.phases.train_s == pytest.approx(t_tr)
    assert result.step.wall_s == pytest.approx(wall)
    assert result.total_usd == pytest.approx(wall * 180 * 8 * 2.69 / 3600)
    assert sum(result.breakdown_usd.values()) == pytest.approx(result.total_usd)


def test_prefix_cache_hit_rate_only_changes_prefill_on_self_hosted() -> None:
    scenario = get_preset("swe_rl")
    cold = dataclasses.replace(scenario.self_host, prefix_cache_hit_rate=0.0)
    hot = self_hosted_cost(scenario.workload, scenario.self_host)
    miss = self_hosted_cost(scenario.workload, cold)
    assert miss.phases.prefill_s > 5 * hot.phases.prefill_s
    assert miss.phases.decode_kv_s == hot.phases.decode_kv_s
    assert miss.phases.train_s == hot.phases.train_s


def test_sync_mode_and_training_extras_cost_more() -> None:
    scenario = get_preset("swe_rl")
    base = self_hosted_cost(scenario.workload, scenario.self_host)
    sync = self_hosted_cost(scenario.workload, dataclasses.replace(scenario.self_host,
                                                                   mode="sync"))
    assert sync.step.wall_s == pytest.approx(base.step.wall_s + scenario.workload.turns * 77.6)
    extras = dataclasses.replace(scenario.self_host, logprob_recompute=True,
                                 reference_forward=True)
    assert self_hosted_cost(scenario.workload, extras).phases.train_s > 1.5 * base.phases.train_s


def test_winner_and_factor() -> None:
    tiny = Workload(name="t", model="Qwen/Qwen3-8B", steps=1, groups_per_step=1, group_size=1,
                    prompt_tokens=10, sample_tokens_per_turn=10)
    scenario = dataclasses.replace(get_preset("math_rl"), workload=tiny,
                                   self_host=SelfHostSetup(fixed_seconds_per_step=60))
    c = compare(scenario)
    assert c.winner == "tinker"
    assert c.factor == pytest.approx(c.self_hosted.total_usd / c.tinker.total_usd)


def test_disaggregated_pools_pay_for_both() -> None:
    scenario = get_preset("swe_rl")
    setup = dataclasses.replace(scenario.self_host, mode="disaggregated", num_gpus=8,
                                trainer_gpus=4)
    result = self_hosted_cost(scenario.workload, setup)
    colocated = self_hosted_cost(scenario.workload, scenario.self_host)
    assert result.step.num_gpus == 12
    # The trainer pool has half the GPUs: training takes twice as long.
    assert result.phases.train_s == pytest.approx(2 * colocated.phases.train_s)
    assert result.phases.rollout_s == pytest.approx(colocated.phases.rollout_s)
    assert result.total_usd == pytest.approx(
        result.step.wall_s * 12 * 200 * 2.69 / 3600)
