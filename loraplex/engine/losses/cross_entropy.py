"""``cross_entropy``: weighted negative log-likelihood, ``loss = Σ_t −w_t · log p(x_t)``.

Weights are arbitrary reals: 0/1 masks from renderers, fractional soft targets, and negative
values (``forward_backward_custom`` sends ``−dC/dℓ`` as weights). Positions with ``w = 0`` are
exactly 0 with zero gradient, even if their logprob is −inf.

Top-K form (Tinker's top-K distillation): ``target_tokens`` and ``weights`` of shape ``[N, K]``
score K candidate tokens per position, ``loss = Σ_t Σ_k −w_{t,k} · log p(x_{t,k})``; the trainer
then gathers ``[T, K]`` logprobs (see `target_logprobs`), returns them as the datum's
``logprobs`` output, and ``elementwise_loss`` is summed over k.
"""

from __future__ import annotations

import torch

from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.ratio import loss_output


def cross_entropy(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """Σ −logp·w over every position (and every k for ``[T, K]`` targets)."""
    logp = logprobs.float()
    weights = inputs.tensors["weights"]
    per_target = torch.where(weights != 0, -logp * weights, 0.0)
    elementwise_T = per_target.sum(dim=-1) if per_target.dim() == 2 else per_target
    return loss_output(elementwise_T)


SPEC = LossSpec(
    name="cross_entropy",
    fn=cross_entropy,
    required_inputs=("weights",),
    allows_2d_targets=True,
)
