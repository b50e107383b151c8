"""Pricing metered usage in both billing modes, by hand."""

from __future__ import annotations

import pytest

from loraplex.cost.price_sheets import TINKER_2026_01_05
from loraplex.cost.pricing import ModelPrice, PriceSheet, TokenUsage, price_usage
from loraplex.errors import UserError

SHEET = PriceSheet(name="test", effective="2026-01-01",
                   prices={"m": ModelPrice(prefill=1.0, sample=3.0, train=2.0)},
                   billing_mode="cache_aware", cached_prefill_ratio=0.2,
                   storage_usd_per_gb_month=0.10, source="test")

# 4 samples of one 1,000-token prompt: 4,000 prompt tokens, 3,000 of them cache hits.
USAGE = TokenUsage(prefill_tokens=4000, cache_hit_tokens=3000, sampled_tokens=2000,
                   trained_tokens=6000, storage_gb_hours=730)


def test_per_rollout_bills_every_prompt_token_in_full() -> None:
    bill = price_usage(USAGE, SHEET, "m", mode="per_rollout")
    assert bill.prefill_usd == pytest.approx(4000 * 1.0 / 1e6)
    assert bill.cached_prefill_usd == 0.0
    assert bill.sample_usd == pytest.approx(2000 * 3.0 / 1e6)
    assert bill.train_usd == pytest.approx(6000 * 2.0 / 1e6)
    assert bill.storage_usd == pytest.approx(0.10)  # 730 GB-hours = 1 GB-month
    assert bill.total_usd == pytest.approx((4000 + 6000 + 12000) / 1e6 + 0.10)


def test_cache_aware_bills_hits_at_the_cached_ratio() -> None:
    bill = price_usage(USAGE, SHEET, "m")  # the sheet's own mode
    assert bill.prefill_usd == pytest.approx(1000 / 1e6)
    assert bill.cached_prefill_usd == pytest.approx(3000 * 0.2 / 1e6)
    free_hits = price_usage(USAGE, SHEET, "m", cached_prefill_ratio=0.0)
    assert free_hits.cached_prefill_usd == 0.0 and free_hits.prefill_usd == bill.prefill_usd


def test_jan_2026_sheet_has_no_discount_and_no_storage_rate() -> None:
    usage = TokenUsage(prefill_tokens=1e6, cache_hit_tokens=5e5, storage_gb_hours=1e3)
    per_rollout = price_usage(usage, TINKER_2026_01_05, "Qwen/Qwen3-8B")
    cache_aware = price_usage(usage, TINKER_2026_01_05, "Qwen/Qwen3-8B", mode="cache_aware")
    assert per_rollout.total_usd == pytest.approx(0.13)
    assert cache_aware.total_usd == pytest.approx(0.13)  # ratio 1.0: hits cost the same
    assert per_rollout.storage_usd == 0.0


def test_usage_adds_and_scales() -> None:
    total = USAGE + USAGE.scaled(2.0)
    assert total.prefill_tokens == 12000 and total.cache_hit_tokens == 9000
    assert total.storage_gb_hours == 3 * 730


def test_bad_inputs_are_user_errors() -> None:
    with pytest.raises(UserError, match="cache_hit_tokens"):
        TokenUsage(prefill_tokens=1, cache_hit_tokens=2)
    with pytest.raises(UserError, match="sampled_tokens"):
        TokenUsage(sampled_tokens=-1)
    with pytest.raises(UserError, match="billing_mode"):
        price_usage(USAGE, SHEET, "m", mode="weekly")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="cached_prefill_ratio"):
        price_usage(USAGE, SHEET, "m", cached_prefill_ratio=1.5)
    with pytest.raises(UserError, match="no price for 'other'"):
        price_usage(USAGE, SHEET, "other")
