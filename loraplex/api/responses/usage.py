"""Metered usage as ``GET /api/v1/loraplex/usage`` and the operator view send it: the price
sheet, priced summaries (`cost.billing.UsageSummary.to_json`, the tenant's totals or one
training run) and the tenant's quota use."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PriceSheetView(BaseModel):
    """The sheet usage is priced with (`cost.billing.Biller.sheet_json`)."""

    name: str
    effective: str = Field(description="ISO date the prices were observed")
    source: str
    cached_prefill_ratio: float


class UsageSummaryView(BaseModel):
    run_id: str | None = Field(description="null: the tenant's totals, or bare-base sampling")
    base_models: list[str]
    tokens: dict[str, int] = Field(description="op and token counters")
    engine_s: dict[str, float] = Field(description="``total`` and per op kind")
    bill_usd: dict[str, dict[str, float]] = Field(
        description="per billing mode, per bill item and ``total``")


class QuotaUse(BaseModel):
    used: int
    limit: int


class UsageView(BaseModel):
    tenant: str
    price_sheet: PriceSheetView
    totals: UsageSummaryView
    runs: list[UsageSummaryView]
    quotas: dict[str, QuotaUse]
    notes: list[str]
