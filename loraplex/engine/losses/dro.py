"""``dro``: direct reward optimisation with a quadratic trust region (Richemond et al. 2024;
Kimi k1.5), as Tinker documents it:

    loss = −Σ_t (log p_t · A_t − ½ β (log p_t − log q_t)²)

``∇ = −(A_t − β (log p_t − log q_t)) ∇log p_t``. ``beta`` comes from ``loss_fn_config``; its
default 0.05 is the value in Tinker's DRO example (Tinker does not publish its default).
Both terms apply only where ``A_t ≠ 0``: the cookbook puts ``log q = 0`` on observation
tokens, where an unmasked quadratic term would be a large spurious penalty.
Metrics: ``importance_ratio:mean`` over active positions.
"""

from __future__ import annotations

import torch

from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.ratio import (
    loss_output,
    masked_log_ratio,
    masked_mean,
    policy_positions,
)


def dro(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """−Σ (logp·A − ½·β·(logp − logq)²)."""
    beta = inputs.config["beta"]
    logp, advantages, active = policy_positions(logprobs, inputs)
    log_ratio = masked_log_ratio(logp, inputs.tensors["logprobs"], active)
    objective = logp * advantages - 0.5 * beta * log_ratio.square()
    elementwise = torch.where(active, -objective, 0.0)
    return loss_output(
        elementwise, {"importance_ratio:mean": masked_mean(log_ratio.exp(), active, empty=1.0)}
    )


SPEC = LossSpec(
    name="dro",
    fn=dro,
    required_inputs=("logprobs", "advantages"),
    config_defaults={"beta": 0.05},
)
