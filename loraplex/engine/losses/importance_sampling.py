"""``importance_sampling``: off-policy REINFORCE, ``loss = −Σ_t r_t · A_t`` with
``r_t = exp(log p_t − log q_t)`` (p: the model being trained, q: the sampler's ``logprobs``).

The gradient is ``−r_t · A_t · ∇log p_t``: REINFORCE re-weighted by the importance ratio, with
no clipping. Only positions with ``A_t ≠ 0`` contribute (see `ratio`).
Metrics: ``importance_ratio:mean`` over active positions (1.0 when there are none).
"""

from __future__ import annotations

import torch

from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.ratio import (
    importance_ratio,
    loss_output,
    masked_mean,
    policy_positions,
)


def importance_sampling(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """−Σ exp(logp − logq)·A."""
    logp, advantages, active = policy_positions(logprobs, inputs)
    ratio = importance_ratio(logp, inputs.tensors["logprobs"], active)
    elementwise = torch.where(active, -ratio * advantages, 0.0)
    return loss_output(
        elementwise, {"importance_ratio:mean": masked_mean(ratio, active, empty=1.0)}
    )


SPEC = LossSpec(
    name="importance_sampling",
    fn=importance_sampling,
    required_inputs=("logprobs", "advantages"),
)
