"""Pieces shared by the policy-gradient losses: the active-position mask, the masked importance
ratio, PPO's clipped surrogate, masked means for metrics (and the clip metrics the ratio-clipping
losses report), and the assembly of a `LossOutput`.

The cookbook strips its ``mask`` before sending, so a zero advantage is the only "no loss here"
signal: every RL loss is exactly zero, with zero gradient, where ``advantages == 0``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput


def clip_bounds(config: Mapping[str, float]) -> tuple[float, float]:
    """``(low, high)``: the ratio bounds ``clip_low_threshold`` / ``clip_high_threshold``."""
    return config["clip_low_threshold"], config["clip_high_threshold"]


def policy_positions(
    logprobs_T: torch.Tensor, inputs: LossInputs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log p, A, active)``: float32 target logprobs, the advantages and `active_positions`."""
    logp_T = logprobs_T.float()
    advantages_T = inputs.tensors["advantages"]
    return logp_T, advantages_T, active_positions(advantages_T)


def active_positions(advantages_T: torch.Tensor) -> torch.Tensor:
    """Bool ``[T]``: positions that carry loss (non-zero advantage)."""
    return advantages_T != 0


def masked_log_ratio(
    logprobs_T: torch.Tensor, behaviour_logprobs_T: torch.Tensor, active_T: torch.Tensor
) -> torch.Tensor:
    """``log p − log q`` on active positions, exactly 0 elsewhere.

    Masking *before* ``exp`` matters: observation positions carry ``log q = 0`` in the cookbook,
    so an unmasked ``exp(log p − log q)`` there could overflow to inf, and ``inf · 0`` would put
    NaN into the forward value and the gradient even though the advantage is zero.
    """
    return torch.where(active_T, logprobs_T - behaviour_logprobs_T, 0.0)


def importance_ratio(
    logprobs_T: torch.Tensor, behaviour_logprobs_T: torch.Tensor, active_T: torch.Tensor
) -> torch.Tensor:
    """``r = exp(log p − log q)`` on active positions, exactly 1 elsewhere (`masked_log_ratio`)."""
    return torch.exp(masked_log_ratio(logprobs_T, behaviour_logprobs_T, active_T))


def clipped_surrogate(
    ratio_T: torch.Tensor, advantages_T: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """PPO's pessimistic surrogate ``min(r·A, clip(r, low, high)·A)`` (zero gradient where the
    clipped branch is the smaller one)."""
    return torch.minimum(ratio_T * advantages_T, ratio_T.clamp(low, high) * advantages_T)


def masked_mean(values_T: torch.Tensor, mask_T: torch.Tensor, empty: float) -> torch.Tensor:
    """Detached mean of ``values_T`` over ``mask_T``; ``empty`` when nothing is selected."""
    values_T = values_T.detach().float()
    count = mask_T.sum()
    total = torch.where(mask_T, values_T, 0.0).sum()
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, empty))


def outside_fraction(
    ratio_T: torch.Tensor, low: float, high: float, active_T: torch.Tensor
) -> torch.Tensor:
    """Fraction of active positions whose ratio lies outside ``[low, high]`` (was clipped)."""
    ratio_T = ratio_T.detach()
    return masked_mean(((ratio_T < low) | (ratio_T > high)).float(), active_T, empty=0.0)


def clip_metrics(
    ratio_T: torch.Tensor, low: float, high: float, active_T: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``clip_fraction:mean`` (`outside_fraction`) and ``importance_ratio:mean`` over active
    positions (1.0 when there are none)."""
    return {
        "clip_fraction:mean": outside_fraction(ratio_T, low, high, active_T),
        "importance_ratio:mean": masked_mean(ratio_T, active_T, empty=1.0),
    }


def loss_output(
    elementwise_T: torch.Tensor, metrics: Mapping[str, torch.Tensor] | None = None
) -> LossOutput:
    """Sum the per-position loss (keeping autograd) and attach ``loss:sum`` to the metrics."""
    loss = elementwise_T.sum()
    detached = loss.detach().float()
    return LossOutput(
        loss=loss,
        elementwise_loss_T=elementwise_T.detach().float(),
        metrics={"loss:sum": detached, **(metrics or {})},
    )
