"""Optimizer hyper-parameters as Tinker sends them with every optim_step: `AdamParams` for
AdamW (the default family) and `DimuonParams` for Dimuon, chosen per training run at create."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from loraplex.errors import user_error

OptimizerFamily = Literal["adamw", "dimuon"]


@dataclass(frozen=True)
class AdamParams:
    """AdamW settings for one step.

    Attributes:
        learning_rate: step size.
        beta1, beta2: moment decay rates in [0, 1).
        eps: denominator epsilon.
        weight_decay: decoupled (AdamW) decay coefficient; 0 disables it.
        grad_clip_norm: clip the adapter's global grad norm to this value; 0 disables it.
    """

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    family: ClassVar[OptimizerFamily] = "adamw"

    def validate(self, field: str = "adam_params") -> AdamParams:
        checks = {
            "learning_rate": self.learning_rate >= 0,
            "beta1": 0 <= self.beta1 < 1,
            "beta2": 0 <= self.beta2 < 1,
            "eps": self.eps > 0,
            "weight_decay": self.weight_decay >= 0,
            "grad_clip_norm": self.grad_clip_norm >= 0,
        }
        _check(self, checks, field)
        return self


@dataclass(frozen=True)
class DimuonParams:
    """Dimuon settings for one step (Tinker's `DimuonParams`; defaults are the SDK's).

    Attributes:
        learning_rate: step size of a direction of Frobenius norm √rank per LoRA matrix.
        grad_clip_norm: clip the adapter's global grad norm to this value; ≤ 0 disables it.
        beta1: momentum EMA coefficient in [0, 1).
        damping: > 0, added to the row and column energies of the preconditioner.
        rank_lr_correction_exponent: the learning rate is scaled by (32 / rank) ** this
            exponent (0: no rank correction).
    """

    learning_rate: float
    grad_clip_norm: float = 0.0
    beta1: float = 0.9
    damping: float = 1e-4
    rank_lr_correction_exponent: float = 0.175
    family: ClassVar[OptimizerFamily] = "dimuon"

    def validate(self, field: str = "optimizer_params") -> DimuonParams:
        checks = {
            "learning_rate": self.learning_rate >= 0,
            "grad_clip_norm": True,
            "beta1": 0 <= self.beta1 < 1,
            "damping": self.damping > 0,
            "rank_lr_correction_exponent": True,
        }
        _check(self, checks, field)
        return self


OptimParams = AdamParams | DimuonParams


def _check(params: AdamParams | DimuonParams, checks: dict[str, bool], field: str) -> None:
    """A 4xx naming the first field that is not a finite number or fails its check."""
    for name, ok in checks.items():
        value = getattr(params, name)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or not ok):
            raise user_error(f"{field}.{name}", f"invalid value {value!r}")
