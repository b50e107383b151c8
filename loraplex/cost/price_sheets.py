"""Dated Tinker price sheets (USD per 1M prefill / sample / train tokens).

* ``tinker-2026-01-05``: the list the published comparison used. Every prompt token of every
  sample billed in full; no cache discount; storage rate not stated at the time.
* ``tinker-2026-06``: the `tinker-cost` 0.1.0 snapshot after the 2026-06-12 lineup change.
* ``tinker-2026-10-07``: after the 2026-07-17 change — cached prefill at 20% of prefill, a
  group's shared prompt billed once plus ``G-1`` cache hits, storage $0.10/GB-month, standard
  context rates about 1.5× June's. Only rates quoted by the snapshot are listed; train rates
  the snapshot did not quote are June's × 1.5 and marked in ``inferred``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loraplex.cost.catalogue import look_up
from loraplex.cost.pricing import BILLING_MODES, ModelPrice, PriceSheet
from loraplex.errors import user_error


def _p(prefill: float, sample: float, train: float) -> ModelPrice:
    return ModelPrice(prefill, sample, train)


TINKER_2026_01_05 = PriceSheet(
    name="tinker-2026-01-05", effective="2026-01-05",
    prices={
        "Qwen/Qwen3-4B-Instruct-2507": _p(0.07, 0.22, 0.22),
        "Qwen/Qwen3-8B": _p(0.13, 0.40, 0.40),
        "Qwen/Qwen3-30B-A3B": _p(0.12, 0.30, 0.36),
        "Qwen/Qwen3-VL-30B-A3B-Instruct": _p(0.18, 0.44, 0.53),
        "Qwen/Qwen3-32B": _p(0.49, 1.47, 1.47),
        "Qwen/Qwen3-235B-A22B-Instruct-2507": _p(0.68, 1.70, 2.04),
        "Qwen/Qwen3-VL-235B-A22B-Instruct": _p(1.02, 2.56, 3.07),
        "meta-llama/Llama-3.2-1B": _p(0.03, 0.09, 0.09),
        "meta-llama/Llama-3.2-3B": _p(0.06, 0.18, 0.18),
        "meta-llama/Llama-3.1-8B": _p(0.13, 0.40, 0.40),
        "meta-llama/Llama-3.1-8B-Instruct": _p(0.13, 0.40, 0.40),
        "meta-llama/Llama-3.1-70B": _p(1.05, 3.16, 3.16),
        "deepseek-ai/DeepSeek-V3.1": _p(1.13, 2.81, 3.38),
        "openai/gpt-oss-120b": _p(0.18, 0.44, 0.52),
        "openai/gpt-oss-20b": _p(0.12, 0.30, 0.36),
        "moonshotai/Kimi-K2-Thinking": _p(0.98, 2.44, 2.93),
    },
    billing_mode="per_rollout", cached_prefill_ratio=1.0, storage_usd_per_gb_month=None,
    source="Tinker's price table 'as of January 5, 2026' on https://thinkingmachines.ai/tinker/ "
           "(compare that date's copy on web.archive.org)",
)

TINKER_2026_06 = PriceSheet(
    name="tinker-2026-06", effective="2026-06-26",
    prices={
        "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": _p(1.66, 4.15, 4.98),
        "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16:peft:262144": _p(3.32, 8.30, 9.96),
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": _p(0.38, 0.96, 1.16),
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16:peft:262144": _p(0.76, 1.92, 2.32),
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": _p(0.13, 0.33, 0.40),
        "moonshotai/Kimi-K2.6": _p(1.47, 3.66, 4.40),
        "moonshotai/Kimi-K2.5": _p(1.47, 3.66, 4.40),
        "moonshotai/Kimi-K2.6:peft:131072": _p(5.15, 12.81, 15.40),
        "moonshotai/Kimi-K2.5:peft:131072": _p(5.15, 12.81, 15.40),
        "Qwen/Qwen3.6-35B-A3B": _p(0.36, 0.89, 1.07),
        "Qwen/Qwen3.5-35B-A3B-Base": _p(0.36, 0.89, 1.07),
        "Qwen/Qwen3.6-27B": _p(1.24, 3.73, 3.73),
        "Qwen/Qwen3.5-397B-A17B": _p(2.00, 5.00, 6.00),
        "Qwen/Qwen3.5-397B-A17B:peft:262144": _p(4.00, 10.00, 12.00),
        "Qwen/Qwen3.5-9B": _p(0.44, 1.33, 1.33),
        "Qwen/Qwen3.5-9B-Base": _p(0.44, 1.33, 1.33),
        "Qwen/Qwen3.5-4B": _p(0.22, 0.67, 0.67),
        "Qwen/Qwen3-8B": _p(0.13, 0.40, 0.40),
        "openai/gpt-oss-120b": _p(0.18, 0.44, 0.52),
        "openai/gpt-oss-120b:peft:131072": _p(0.63, 1.54, 1.82),
        "openai/gpt-oss-20b": _p(0.12, 0.30, 0.36),
        "deepseek-ai/DeepSeek-V3.1": _p(1.13, 2.81, 3.38),
    },
    billing_mode="per_rollout", cached_prefill_ratio=1.0, storage_usd_per_gb_month=None,
    source="PRICING dict of tinker-cost 0.1.0 (https://pypi.org/project/tinker-cost/0.1.0/), "
           "announced 2026-06-26 in "
           "https://github.com/thinking-machines-lab/tinker-cookbook/issues/298",
)

TINKER_2026_10_07 = PriceSheet(
    name="tinker-2026-10-07", effective="2026-10-07",
    prices={
        "Qwen/Qwen3.6-27B": _p(1.86, 5.595, 5.595),
        "Qwen/Qwen3.6-35B-A3B": _p(0.54, 1.335, 1.605),
        "Qwen/Qwen3.5-397B-A17B": _p(3.00, 7.50, 9.00),
    },
    billing_mode="cache_aware", cached_prefill_ratio=0.2, storage_usd_per_gb_month=0.10,
    source="https://tinker-docs.thinkingmachines.ai/tinker/models/models_and_pricing/ as read "
           "2026-10-07 (storage and the 80% cached-prefill discount transcribed that day in "
           "github.com/api-evangelist/thinking-machines, "
           "plans/thinking-machines-plans-pricing.yml); cached-prefill billing: Tinker changelog "
           "2026-07-17 and the SampleResponse docstring in "
           "github.com/thinking-machines-lab/tinker, src/tinker/types/sample_response.py",
    inferred={
        "Qwen/Qwen3.6-27B": "train = sample (dense models price them equally on every sheet)",
        "Qwen/Qwen3.6-35B-A3B": "train = June's 1.07 × 1.5",
        "Qwen/Qwen3.5-397B-A17B": "train = June's 6.00 × 1.5",
    },
)

PRICE_SHEETS: dict[str, PriceSheet] = {
    sheet.name: sheet for sheet in (TINKER_2026_01_05, TINKER_2026_06, TINKER_2026_10_07)}


def get_price_sheet(name: str) -> PriceSheet:
    """The dated sheet called ``name``.

    Raises:
        UserError: unknown name; the message lists the known ones.
    """
    return look_up(PRICE_SHEETS, name, "price_sheet", "sheet")


_SHEET_KEYS = {"base", "name", "effective", "billing_mode", "cached_prefill_ratio",
               "storage_usd_per_gb_month", "prices"}


def price_sheet_from_mapping(values: Mapping[str, Any], where: str = "price_sheet") -> PriceSheet:
    """A price sheet from a config table (e.g. a server's ``[pricing]`` TOML section).

    Keys: ``base`` (a dated sheet to start from), ``name``, ``effective``, ``billing_mode``,
    ``cached_prefill_ratio``, ``storage_usd_per_gb_month`` and ``prices`` (model →
    ``{prefill, sample, train}`` in USD per 1M tokens, added to or replacing the base's).

    Raises:
        UserError: unknown keys, a bad mode or ratio, or a price that is missing or negative.
    """
    unknown = sorted(set(values) - _SHEET_KEYS)
    if unknown:
        raise user_error(where, f"unknown keys {unknown}; known: {sorted(_SHEET_KEYS)}")
    base = get_price_sheet(values["base"]) if "base" in values else None
    prices = dict(base.prices) if base else {}
    for model, rates in dict(values.get("prices", {})).items():
        prices[model] = _model_price(rates, f"{where}.prices.{model}")
    mode = values.get("billing_mode", base.billing_mode if base else "per_rollout")
    if mode not in BILLING_MODES:
        raise user_error(f"{where}.billing_mode", f"expected one of {BILLING_MODES}")
    ratio = float(values.get("cached_prefill_ratio", base.cached_prefill_ratio if base else 1.0))
    if not 0.0 <= ratio <= 1.0:
        raise user_error(f"{where}.cached_prefill_ratio", "must be in [0, 1]")
    storage = values.get("storage_usd_per_gb_month",
                         base.storage_usd_per_gb_month if base else None)
    return PriceSheet(
        name=str(values.get("name", f"custom ({base.name})" if base else "custom")),
        effective=str(values.get("effective", base.effective if base else "")),
        prices=prices, billing_mode=mode, cached_prefill_ratio=ratio,
        storage_usd_per_gb_month=None if storage is None else float(storage),
        source=f"configured{f' from {base.name}' if base else ''}")


def _model_price(rates: Any, where: str) -> ModelPrice:
    if not isinstance(rates, Mapping) or set(rates) != {"prefill", "sample", "train"}:
        raise user_error(where, "expected {prefill, sample, train} in USD per 1M tokens")
    values = {k: float(v) for k, v in rates.items()}
    if min(values.values()) < 0:
        raise user_error(where, "prices must be ≥ 0")
    return ModelPrice(**values)
