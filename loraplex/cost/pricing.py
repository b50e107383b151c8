"""Per-token pricing: a dated price sheet, metered token usage, and the bill one makes of the other.

Two billing modes, both priced from the same `TokenUsage`:

* ``per_rollout`` (Tinker until July 2026): every prompt token of every sample is billed at the
  prefill rate — ``G`` samples of one prompt pay it ``G`` times, and a multi-turn rollout pays
  its whole history again each turn. Cache hits are counted but not discounted.
* ``cache_aware`` (Tinker from 2026-07-17): prompt tokens served from the prefix cache (a
  group's shared prompt after its first sample, a turn's history) are billed at
  ``cached_prefill_ratio × prefill``.

Usage is what a server meters, or what `calculator.tinker_rollout_usage` derives from a
workload; this module only multiplies. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loraplex.errors import user_error

BillingMode = Literal["per_rollout", "cache_aware"]
BILLING_MODES: tuple[BillingMode, ...] = ("per_rollout", "cache_aware")
HOURS_PER_MONTH = 730.0
"""Storage is quoted per GB-month and metered in GB-hours (365·24/12 hours a month)."""


@dataclass(frozen=True)
class ModelPrice:
    """USD per 1M tokens for one model.

    Attributes:
        prefill: prompt tokens of sampling requests (and extra forward passes).
        sample: generated tokens.
        train: every token of a ``forward_backward`` datum (prompt and observations included).
    """

    prefill: float
    sample: float
    train: float


@dataclass(frozen=True)
class PriceSheet:
    """A provider's prices as of one date.

    Attributes:
        name: catalogue key (``tinker-2026-01-05``).
        effective: ISO date the prices were observed.
        prices: model name → rates.
        billing_mode: how the provider billed prompts at that date.
        cached_prefill_ratio: price of a prefix-cache hit relative to prefill (1.0: no discount).
        storage_usd_per_gb_month: checkpoint storage rate; None when the sheet does not state it
            (storage is then billed at 0 and the bill says so).
        source: where the numbers come from.
        inferred: models whose rates are derived, not read off the sheet (with why).
    """

    name: str
    effective: str
    prices: dict[str, ModelPrice]
    billing_mode: BillingMode
    cached_prefill_ratio: float
    storage_usd_per_gb_month: float | None
    source: str
    inferred: dict[str, str] | None = None

    def price_for(self, model: str) -> ModelPrice:
        """Rates of ``model``.

        Raises:
            UserError: the sheet does not list the model.
        """
        price = self.prices.get(model)
        if price is None:
            raise user_error("tinker_model", f"{self.name} has no price for {model!r}; it lists "
                             f"{sorted(self.prices)}")
        return price


@dataclass(frozen=True)
class TokenUsage:
    """Billable quantities, summed over any number of requests.

    Attributes:
        prefill_tokens: prompt tokens of every sample, each sample counted (a prompt sampled
            ``G`` times counts ``G·len``), cache hits included.
        cache_hit_tokens: the part of ``prefill_tokens`` served from the prefix cache.
        sampled_tokens: generated tokens.
        trained_tokens: tokens of forward_backward datums.
        storage_gb_hours: checkpoint bytes held × hours held, in GB-hours.
    """

    prefill_tokens: float = 0.0
    cache_hit_tokens: float = 0.0
    sampled_tokens: float = 0.0
    trained_tokens: float = 0.0
    storage_gb_hours: float = 0.0

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if value < 0:
                raise user_error(f"usage.{name}", f"must be ≥ 0, got {value}")
        if self.cache_hit_tokens > self.prefill_tokens * (1 + 1e-12):
            raise user_error("usage.cache_hit_tokens", "exceeds prefill_tokens")

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def scaled(self, factor: float) -> TokenUsage:
        """The usage of ``factor`` identical copies (e.g. rollouts × steps)."""
        return TokenUsage(*(v * factor for v in self._values()))

    def _values(self) -> tuple[float, ...]:
        return (self.prefill_tokens, self.cache_hit_tokens, self.sampled_tokens,
                self.trained_tokens, self.storage_gb_hours)


@dataclass(frozen=True)
class Bill:
    """USD per line item; ``cached_prefill_usd`` is the cache-hit part of prefill."""

    prefill_usd: float
    cached_prefill_usd: float
    sample_usd: float
    train_usd: float
    storage_usd: float

    @property
    def total_usd(self) -> float:
        return (self.prefill_usd + self.cached_prefill_usd + self.sample_usd + self.train_usd
                + self.storage_usd)


def price_usage(usage: TokenUsage, sheet: PriceSheet, model: str,
                mode: BillingMode | None = None,
                cached_prefill_ratio: float | None = None) -> Bill:
    """Price metered usage of ``model`` with ``sheet``.

    Args:
        usage: what was consumed.
        sheet: the dated rates.
        model: the sheet's model name.
        mode: ``per_rollout`` or ``cache_aware``; None uses the sheet's own mode.
        cached_prefill_ratio: overrides the sheet's cache-hit discount (cache_aware only).

    Raises:
        UserError: unknown model or mode, or a ratio outside [0, 1].
    """
    price = sheet.price_for(model)
    mode = sheet.billing_mode if mode is None else mode
    if mode not in BILLING_MODES:
        raise user_error("billing_mode", f"expected one of {BILLING_MODES}, got {mode!r}")
    ratio = sheet.cached_prefill_ratio if cached_prefill_ratio is None else cached_prefill_ratio
    if not 0.0 <= ratio <= 1.0:
        raise user_error("cached_prefill_ratio", f"must be in [0, 1], got {ratio}")
    per_token = 1e-6
    hits = usage.cache_hit_tokens if mode == "cache_aware" else 0.0
    storage_rate = sheet.storage_usd_per_gb_month or 0.0
    return Bill(
        prefill_usd=(usage.prefill_tokens - hits) * price.prefill * per_token,
        cached_prefill_usd=hits * price.prefill * ratio * per_token,
        sample_usd=usage.sampled_tokens * price.sample * per_token,
        train_usd=usage.trained_tokens * price.train * per_token,
        storage_usd=usage.storage_gb_hours / HOURS_PER_MONTH * storage_rate,
    )
