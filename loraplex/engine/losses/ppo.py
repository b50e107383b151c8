"""``ppo``: token-wise clipped surrogate (Schulman et al. 2017), as Tinker documents it:

    loss = −Σ_t min(r_t · A_t, clip(r_t, low, high) · A_t),   r_t = exp(log p_t − log q_t)

``low`` / ``high`` are *ratio bounds* from ``loss_fn_config`` (``clip_low_threshold``,
``clip_high_threshold``), default 0.8 / 1.2 (Tinker's ε = 0.2). Where the clipped branch is the
smaller one the token's gradient is zero. Only positions with ``A_t ≠ 0`` contribute.
Metrics: ``clip_fraction:mean`` (active positions with r outside [low, high]) and
``importance_ratio:mean``.
"""

from __future__ import annotations

import torch

from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.ratio import (
    clip_bounds,
    clip_metrics,
    clipped_surrogate,
    importance_ratio,
    loss_output,
    policy_positions,
)


def ppo(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """−Σ min(r·A, clip(r, low, high)·A)."""
    low, high = clip_bounds(inputs.config)
    logp, advantages, active = policy_positions(logprobs, inputs)
    ratio = importance_ratio(logp, inputs.tensors["logprobs"], active)
    elementwise = torch.where(active, -clipped_surrogate(ratio, advantages, low, high), 0.0)
    return loss_output(elementwise, clip_metrics(ratio, low, high, active))


SPEC = LossSpec(
    name="ppo",
    fn=ppo,
    required_inputs=("logprobs", "advantages"),
    config_defaults={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
)
