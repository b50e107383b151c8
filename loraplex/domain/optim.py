"""Optimizer hyper-parameters as Tinker's `AdamParams` sends them with every optim_step."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loraplex.errors import user_error


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

    def validate(self, field: str = "adam_params") -> AdamParams:
        checks = {
            "learning_rate": self.learning_rate >= 0,
            "beta1": 0 <= self.beta1 < 1,
            "beta2": 0 <= self.beta2 < 1,
            "eps": self.eps > 0,
            "weight_decay": self.weight_decay >= 0,
            "grad_clip_norm": self.grad_clip_norm >= 0,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not ok:
                raise user_error(f"{field}.{name}", f"invalid value {value!r}")
        return self
