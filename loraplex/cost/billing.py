"""Prices metered usage per tenant and per training run, in both billing modes.

Turns the usage store's raw counters into `loraplex.cost.pricing.TokenUsage` and prices them
with the configured sheet (`MeteringConfig`), a served NAME mapping to a sheet model:

* ``per_rollout`` (Tinker-style): every sample pays its whole prompt — a prompt sampled ``G``
  times is billed ``G`` times — and forward-only tokens are billed as prefill; no discount.
* ``cache_aware``: a group's shared prompt is billed once and its other ``G - 1`` copies, like
  the engine's own prefix-cache hits, at ``cached_prefill_ratio`` × prefill.

A model a built-in sheet does not list but another built-in sheet does (Qwen3.5 and gpt-oss are
absent from the January 2026 default) takes its catalogue rates from the newest sheet listing
it (`with_later_models`; the sheet's ``inferred`` says which). A mixture-of-experts model served
under a NAME that no sheet lists nor the config maps is priced as the sheet model of the
nearest *active* parameter count (`Biller` ``active_params``, which
the server fills for its MoE models): one with 3B of 30B parameters active is priced like
Qwen3-30B-A3B, not like a dense 30B model; other unknown names get ``default_model``.
Storage is not metered yet (billed at 0). No I/O: callers pass the rows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace

from loraplex.config import MeteringConfig
from loraplex.cost.cards.models import MODEL_CARDS
from loraplex.cost.price_sheets import PRICE_SHEETS, get_price_sheet, price_sheet_from_mapping
from loraplex.cost.pricing import (
    BILLING_MODES,
    Bill,
    BillingMode,
    PriceSheet,
    TokenUsage,
    price_usage,
)
from loraplex.domain.usage import UsageCounts, UsageKey
from loraplex.errors import user_error

BILL_ITEMS = ("prefill", "cached_prefill", "sample", "train", "storage")


def token_usage(counts: UsageCounts) -> TokenUsage:
    """Billable quantities of ``counts`` (see the module docstring for the two modes)."""
    shared_copies = counts.rollout_prompt_tokens - counts.prompt_tokens
    return TokenUsage(
        prefill_tokens=counts.rollout_prompt_tokens + counts.forward_tokens,
        cache_hit_tokens=shared_copies + counts.cache_hit_tokens,
        sampled_tokens=counts.sampled_tokens, trained_tokens=counts.trained_tokens)


@dataclass(frozen=True)
class UsageSummary:
    """Usage of one tenant, or of one of its training runs, priced.

    Attributes:
        run_id: the training run (None: the tenant's totals, or sampling of the bare base).
        base_models: the served NAMEs it ran on.
        counts: summed counters.
        engine_s: engine seconds per op kind.
        bills: per billing mode, the bill.
    """

    run_id: str | None
    base_models: tuple[str, ...]
    counts: UsageCounts
    engine_s: dict[str, float]
    bills: dict[BillingMode, Bill]

    def to_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "base_models": list(self.base_models),
            "tokens": {k: v for k, v in asdict(self.counts).items() if k != "engine_s"},
            "engine_s": {"total": self.counts.engine_s, **self.engine_s},
            "bill_usd": {mode: {**{i: getattr(b, f"{i}_usd") for i in BILL_ITEMS},
                                "total": b.total_usd} for mode, b in self.bills.items()},
        }


@dataclass(frozen=True)
class TenantUsage:
    tenant: str
    totals: UsageSummary
    runs: tuple[UsageSummary, ...] = field(default=())


class Biller:
    """Prices usage rows with one sheet.

    Args:
        config: the sheet, the name mapping and the default.
        active_params: served NAME → active parameters of the mixture-of-experts model
            served under it (the server's `ModelInfo.card`), for names the sheet does not know.

    Raises:
        UserError: an unknown sheet, a default or mapped model the sheet does not list, or a
            cache ratio outside [0, 1].
    """

    def __init__(self, config: MeteringConfig,
                 active_params: Mapping[str, int] | None = None) -> None:
        self.config = config
        self.active_params = dict(active_params or {})
        own = (price_sheet_from_mapping(config.price_table, "price_table")
               if config.price_table is not None else get_price_sheet(config.price_sheet))
        self._own_models = sorted(own.prices)  # what an unknown MoE is matched against
        self.sheet: PriceSheet = own if config.price_table is not None else with_later_models(own)
        for model in (config.default_model, *config.model_map.values()):
            self.sheet.price_for(model)
        if config.cached_prefill_ratio is not None and not 0 <= config.cached_prefill_ratio <= 1:
            raise user_error("cached_prefill_ratio", "must be in [0, 1]")
        self.ratio = config.cached_prefill_ratio

    def sheet_model(self, served_name: str) -> str:
        """The sheet model a served NAME is priced as."""
        mapped = self.config.model_map.get(served_name)
        if mapped is not None:
            return mapped
        if served_name in self.sheet.prices:
            return served_name
        active = self.active_params.get(served_name)
        return self.config.default_model if active is None else self.nearest_by_active(active)

    def nearest_by_active(self, active_params: int) -> str:
        """The sheet model (with a catalogued card) whose active parameter count is nearest
        ``active_params`` in ratio (the default model when none has a card)."""
        known = [(abs(math.log(MODEL_CARDS[m].active_params / max(active_params, 1))), m)
                 for m in self._own_models if m in MODEL_CARDS]
        return min(known)[1] if known else self.config.default_model

    def summarize(self, run_id: str | None, rows: Iterable[tuple[UsageKey, UsageCounts]]
                  ) -> UsageSummary:
        by_model: defaultdict[str, UsageCounts] = defaultdict(UsageCounts)
        engine_s: defaultdict[str, float] = defaultdict(float)
        for key, counts in rows:
            by_model[key.base_model] += counts
            engine_s[key.kind] += counts.engine_s
        total = sum(by_model.values(), UsageCounts())
        bills = {mode: _sum_bills(self._price(name, counts, mode)
                                  for name, counts in by_model.items())
                 for mode in BILLING_MODES}
        return UsageSummary(run_id, tuple(sorted(n for n in by_model if n)), total,
                            dict(sorted(engine_s.items())), bills)

    def tenants(self, rows: Iterable[tuple[UsageKey, UsageCounts]]) -> list[TenantUsage]:
        """Per tenant: totals and a per-run breakdown (runs in id order, base sampling last)."""
        grouped: defaultdict[str, defaultdict[str, list[tuple[UsageKey, UsageCounts]]]] = (
            defaultdict(lambda: defaultdict(list)))
        for key, counts in rows:
            grouped[key.tenant][key.run_id].append((key, counts))
        out = []
        for tenant in sorted(grouped):
            runs = grouped[tenant]
            order = sorted(runs, key=lambda r: (r == "", r))
            summaries = tuple(self.summarize(r or None, runs[r]) for r in order)
            totals = self.summarize(None, [row for r in order for row in runs[r]])
            out.append(TenantUsage(tenant, totals, summaries))
        return out

    def sheet_json(self) -> dict[str, object]:
        return {"name": self.sheet.name, "effective": self.sheet.effective,
                "source": self.sheet.source,
                "cached_prefill_ratio": (self.sheet.cached_prefill_ratio if self.ratio is None
                                         else self.ratio)}

    def _price(self, served_name: str, counts: UsageCounts, mode: BillingMode) -> Bill:
        return price_usage(token_usage(counts), self.sheet, self.sheet_model(served_name),
                           mode, self.ratio if mode == "cache_aware" else None)


def with_later_models(sheet: PriceSheet) -> PriceSheet:
    """``sheet`` plus the catalogue rates of every model only other built-in sheets list, each
    from the newest sheet listing it (noted in ``inferred``); its own rates are unchanged."""
    extra: dict[str, PriceSheet] = {}  # model → the newest sheet listing it
    for other in sorted(PRICE_SHEETS.values(), key=lambda s: s.effective):
        for model in other.prices:
            if model not in sheet.prices:
                extra[model] = other
    if not extra:
        return sheet
    prices = {**{m: other.prices[m] for m, other in extra.items()}, **sheet.prices}
    inferred = {**{m: f"not on this sheet: {other.name}'s rates" for m, other in extra.items()},
                **(sheet.inferred or {})}
    return replace(sheet, prices=prices, inferred=inferred)


def _sum_bills(bills: Iterable[Bill]) -> Bill:
    total = Bill(0.0, 0.0, 0.0, 0.0, 0.0)
    for bill in bills:
        total = Bill(*(getattr(total, f.name) + getattr(bill, f.name) for f in fields(Bill)))
    return total
