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
    active_positions,
    loss_output,
    masked_log_ratio,
    masked_mean,
    outside_fraction,
)


def ppo(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """−Σ min(r·A, clip(r, low, high)·A)."""
    low = inputs.config["clip_low_threshold"]
    high = inputs.config["clip_high_threshold"]
    logp = logprobs.float()
    advantages = inputs.tensors["advantages"]
    active = active_positions(advantages)
    ratio = torch.exp(masked_log_ratio(logp, inputs.tensors["logprobs"], active))
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    elementwise = torch.where(active, -surrogate, 0.0)
    return loss_output(
        elementwise,
        {
            "clip_fraction:mean": outside_fraction(ratio, low, high, active),
            "importance_ratio:mean": masked_mean(ratio, active, empty=1.0),
        },
    )


SPEC = LossSpec(
    name="ppo",
    fn=ppo,
    required_inputs=("logprobs", "advantages"),
    config_defaults={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
)
