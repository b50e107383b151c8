"""Plain-data views of calculator results (for JSON output and plots); no formatting choices
beyond rounding, no I/O."""

from __future__ import annotations

from typing import Any

from loraplex.cost.calculator import Comparison, SelfHostedResult, TinkerResult
from loraplex.cost.pricing import Bill

TINKER_ITEMS = ("prefill", "cached_prefill", "sample", "train", "storage")
SELF_HOSTED_ITEMS = ("prefill", "decode_weights", "decode_kv", "train", "env_idle", "fixed")


def bill_items(bill: Bill) -> dict[str, float]:
    """Tinker line items in `TINKER_ITEMS` order."""
    return {item: getattr(bill, f"{item}_usd") for item in TINKER_ITEMS}


def tinker_to_dict(result: TinkerResult) -> dict[str, Any]:
    u = result.usage
    return {
        "price_sheet": result.setup.price_sheet, "model": result.model,
        "billing_mode": result.setup.billing_mode, "cache_hits": result.setup.cache_hits,
        "train_token_basis": result.setup.train_token_basis,
        "total_usd": round(result.total_usd, 2),
        "breakdown_usd": {k: round(v, 2) for k, v in bill_items(result.bill).items()},
        "tokens": {"prefill": u.prefill_tokens, "cache_hits": u.cache_hit_tokens,
                   "sampled": u.sampled_tokens, "trained": u.trained_tokens},
    }


def self_hosted_to_dict(result: SelfHostedResult) -> dict[str, Any]:
    p, layout = result.phases, result.layout
    return {
        "hardware": result.hardware.name, "num_gpus": result.step.num_gpus,
        "tensor_parallel": layout.tensor_parallel, "replicas": layout.num_replicas,
        "usd_per_gpu_hour": result.usd_per_gpu_hour,
        "total_usd": round(result.total_usd, 2),
        "breakdown_usd": {k: round(v, 2) for k, v in result.breakdown_usd.items()},
        "step_seconds": {"prefill": p.prefill_s, "decode_weights": p.decode_weights_s,
                         "decode_kv": p.decode_kv_s, "train": p.train_s, "env": p.env_s,
                         "fixed": p.fixed_s, "wall": result.step.wall_s},
        "wall_clock_hours": result.wall_clock_s / 3600.0,
        "utilization": result.step.utilization,
    }


def comparison_to_dict(comparison: Comparison) -> dict[str, Any]:
    """Everything `loraplex cost compare --json` prints."""
    s = comparison.scenario
    return {
        "workload": s.workload.name, "model": s.workload.model,
        "calibration": s.calibration, "notes": list(s.notes),
        "tinker": tinker_to_dict(comparison.tinker),
        "tinker_cached": (tinker_to_dict(comparison.tinker_cached)
                          if comparison.tinker_cached else None),
        "self_hosted": self_hosted_to_dict(comparison.self_hosted),
        "winner": comparison.winner, "factor": round(comparison.factor, 3),
    }
