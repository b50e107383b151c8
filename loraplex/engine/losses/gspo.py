"""``gspo``: group sequence policy optimisation (Zheng et al. 2025), token variant, as Tinker
documents it. Per datum (= one sequence), over the positions M that ``sequence_ratio_mask``
marks (non-zero):

    s      = exp( mean_{t∈M} (log p_t − log q_t) )            (no gradient through s itself)
    s_t    = sg(s) · p_t / sg(p_t)                            (value s, gradient s·∇log p_t)
    loss   = −Σ_t min(s_t · A_t, clip(s_t, low, high) · A_t)

So a whole sequence is kept or clipped together, while per-token advantages still work. A datum
whose mask is empty gets s = 1. Bounds default to the paper's 1 − 3e-4 / 1 + 4e-4 (sequence
ratios are geometric means and stay near 1; ``clip_low_threshold`` / ``clip_high_threshold``
override). Only positions with ``A_t ≠ 0`` contribute.
Metrics: ``clip_fraction:mean`` (active positions whose s is outside the bounds),
``importance_ratio:mean`` (mean s over active positions).
"""

from __future__ import annotations

import torch

from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.ratio import (
    clip_bounds,
    clip_metrics,
    clipped_surrogate,
    loss_output,
    policy_positions,
)


def sequence_log_ratio(
    logprobs_T: torch.Tensor, inputs: LossInputs, in_ratio_T: torch.Tensor
) -> torch.Tensor:
    """Detached ``[T]``: each position's datum's mean log-ratio over its masked positions."""
    token_log_ratio = torch.where(in_ratio_T, logprobs_T.detach() - inputs.tensors["logprobs"], 0.0)
    index = inputs.datum_index_T  # N below: the request's datums
    sums_N = torch.zeros(inputs.num_datums, device=index.device).index_add_(
        0, index, token_log_ratio
    )
    counts_N = torch.zeros(inputs.num_datums, device=index.device).index_add_(
        0, index, in_ratio_T.float()
    )
    mean_N = torch.where(counts_N > 0, sums_N / counts_N.clamp(min=1), 0.0)
    return mean_N[index]


def gspo(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """−Σ min(s_t·A, clip(s_t, low, high)·A) with the per-sequence ratio s."""
    low, high = clip_bounds(inputs.config)
    logp, advantages, active = policy_positions(logprobs, inputs)
    in_ratio = inputs.tensors["sequence_ratio_mask"] != 0
    seq_log_ratio = sequence_log_ratio(logp, inputs, in_ratio)
    # logp − sg(logp) is 0 in value but carries ∇log p, so ratio = s with gradient s·∇log p.
    ratio = torch.exp(torch.where(active, seq_log_ratio + logp - logp.detach(), 0.0))
    elementwise = torch.where(active, -clipped_surrogate(ratio, advantages, low, high), 0.0)
    return loss_output(elementwise, clip_metrics(ratio, low, high, active))


SPEC = LossSpec(
    name="gspo",
    fn=gspo,
    required_inputs=("logprobs", "advantages", "sequence_ratio_mask"),
    config_defaults={"clip_low_threshold": 1.0 - 3e-4, "clip_high_threshold": 1.0 + 4e-4},
)
