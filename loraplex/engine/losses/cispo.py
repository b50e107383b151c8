"""``cispo``: clipped-importance-sampling policy optimisation (MiniMax-M1), as Tinker documents:

    loss = −Σ_t sg(clip(r_t, low, high)) · log p_t · A_t,   r_t = exp(log p_t − log q_t)

The clipped ratio is a detached coefficient, so no token's gradient is ever zeroed, only bounded:
``∇ = −clip(r_t)·A_t·∇log p_t``. Defaults are Tinker's one-sided clip ``low = 0.0``,
``high = 4.0`` (``clip_low_threshold`` / ``clip_high_threshold``). Only ``A_t ≠ 0`` contributes.
Metrics: ``clip_fraction:mean`` and ``importance_ratio:mean`` over active positions.
"""

from __future__ import annotations

import torch

from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.ratio import (
    clip_bounds,
    clip_metrics,
    importance_ratio,
    loss_output,
    policy_positions,
)


def cispo(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """−Σ sg(clip(r, low, high))·logp·A."""
    low, high = clip_bounds(inputs.config)
    logp, advantages, active = policy_positions(logprobs, inputs)
    ratio = importance_ratio(logp, inputs.tensors["logprobs"], active)
    coefficient = ratio.clamp(low, high).detach()
    elementwise = torch.where(active, -coefficient * logp * advantages, 0.0)
    return loss_output(elementwise, clip_metrics(ratio, low, high, active))


SPEC = LossSpec(
    name="cispo",
    fn=cispo,
    required_inputs=("logprobs", "advantages"),
    config_defaults={"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
)
