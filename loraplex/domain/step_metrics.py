"""Per-step training metrics: what one finished forward_backward, forward or optim_step op
reported (`StepPoint`), and how several ops' metrics fold into one value per key (`fold`).

Keys are Tinker's ``name:reduction`` strings. Folding follows the SDK's own rule for the chunks
of one call (``tinker.lib.chunked_fwdbwd_helpers``): ``sum`` adds, ``min`` / ``max`` keep the
extreme, ``mean`` (and ``slack``, approximated) is the mean weighted by datums; any other
reduction keeps the latest value. A value that is not finite stays so (stored as NULL). So a
step that the SDK sent as three chunks folds to what the client saw as the call's result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PointKind = Literal["forward_backward", "forward", "optim_step"]
SeriesKind = Literal["train", "forward"]
"""``train``: one point per optim step (the forward_backward ops since the previous step, then
the step's own metrics); ``forward``: forward-only ops (evaluations), folded per step."""


@dataclass(frozen=True)
class StepPoint:
    """One finished training op's metrics, as the clock thread logs it.

    Attributes:
        model_id: the training run.
        kind: which op reported them.
        metrics: ``name:reduction`` → value.
        num_data: datums it carried (the weight of its ``mean`` metrics; 0 for an optim step).
        num_tokens: datum tokens it carried.
        wall_time: ``time.time()`` when it finished.
    """

    model_id: str
    tenant: str
    kind: PointKind
    metrics: Mapping[str, float]
    num_data: int
    num_tokens: int
    wall_time: float


def reduction_of(key: str) -> str:
    """``loss:sum`` → ``sum`` (a key without a suffix reduces as ``mean``)."""
    _, sep, reduction = key.rpartition(":")
    return reduction if sep else "mean"


def fold(value: float, weight: float, new: float, new_weight: float, key: str
         ) -> tuple[float, float]:
    """``(value, weight)`` of ``key`` after adding one more op's ``new`` (weighted by its datums)
    to what earlier ops folded to ``value`` (their total weight ``weight``)."""
    reduction = reduction_of(key)
    total = weight + new_weight
    if reduction == "sum":
        return value + new, total
    if reduction == "min":
        return min(value, new), total
    if reduction == "max":
        return max(value, new), total
    if reduction in ("mean", "slack"):
        if total <= 0:
            return (value + new) / 2, total
        return (value * weight + new * new_weight) / total, total
    return new, total
