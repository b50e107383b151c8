"""The dated Tinker sheets: the published comparison's prices and the later cache rule."""

from __future__ import annotations

import pytest

from loraplex.cost.price_sheets import PRICE_SHEETS, get_price_sheet, price_sheet_from_mapping
from loraplex.cost.pricing import ModelPrice
from loraplex.errors import UserError


def test_jan_2026_prices_of_the_published_rows() -> None:
    sheet = get_price_sheet("tinker-2026-01-05")
    rows = {"Qwen/Qwen3-4B-Instruct-2507": (0.07, 0.22, 0.22), "Qwen/Qwen3-8B": (0.13, 0.40, 0.40),
            "Qwen/Qwen3-32B": (0.49, 1.47, 1.47), "moonshotai/Kimi-K2-Thinking": (0.98, 2.44, 2.93)}
    for model, (prefill, sample, train) in rows.items():
        price = sheet.price_for(model)
        assert (price.prefill, price.sample, price.train) == (prefill, sample, train)
    assert sheet.billing_mode == "per_rollout" and sheet.cached_prefill_ratio == 1.0


def test_later_sheet_discounts_cache_hits_to_20_percent_and_bills_storage() -> None:
    sheet = get_price_sheet("tinker-2026-10-07")
    assert sheet.billing_mode == "cache_aware" and sheet.cached_prefill_ratio == 0.2
    assert sheet.storage_usd_per_gb_month == 0.10
    assert sheet.price_for("Qwen/Qwen3.6-27B").prefill * 0.2 == pytest.approx(0.372)
    assert set(sheet.inferred or {}) <= set(sheet.prices)


def test_sheets_are_dated_and_sourced() -> None:
    for sheet in PRICE_SHEETS.values():
        assert sheet.effective[:4] == "2026" and sheet.source
        for price in sheet.prices.values():
            assert 0 < price.prefill <= price.sample <= price.train


def test_unknown_sheet() -> None:
    with pytest.raises(UserError, match="tinker-2026-01-05"):
        get_price_sheet("tinker-1999")


def test_configured_sheet_extends_a_dated_one() -> None:
    sheet = price_sheet_from_mapping({
        "base": "tinker-2026-01-05", "billing_mode": "cache_aware", "cached_prefill_ratio": 0.2,
        "prices": {"my/model": {"prefill": 1, "sample": 2, "train": 3}}})
    assert sheet.price_for("my/model") == ModelPrice(1.0, 2.0, 3.0)
    assert sheet.price_for("Qwen/Qwen3-8B").prefill == 0.13
    assert (sheet.billing_mode, sheet.cached_prefill_ratio) == ("cache_aware", 0.2)
    assert sheet.storage_usd_per_gb_month is None and "tinker-2026-01-05" in sheet.source


def test_configured_sheet_validation() -> None:
    with pytest.raises(UserError, match="unknown keys"):
        price_sheet_from_mapping({"discount": 1})
    with pytest.raises(UserError, match="billing_mode"):
        price_sheet_from_mapping({"billing_mode": "monthly"})
    with pytest.raises(UserError, match=r"prices\.m"):
        price_sheet_from_mapping({"prices": {"m": {"prefill": 1}}})
    with pytest.raises(UserError, match="≥ 0"):
        price_sheet_from_mapping({"prices": {"m": {"prefill": -1, "sample": 1, "train": 1}}})
