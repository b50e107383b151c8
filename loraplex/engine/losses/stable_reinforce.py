"""``stable_reinforce``: REINFORCE with truncated importance weights against the behaviour
logprobs recorded at sampling time, plus an optional quadratic trust-region term.

Tinker documents the loss as "a REINFORCE variant that stays stable when the sampling policy
differs from the policy being trained (async RL, different numerics)" using information recorded
at sampling time, but not its formula. Ours, per position t with ``A_t ≠ 0``:

    log q_t = recorded_logprobs_t   (the sampler's own record, found through provenance spans;
                                     where no span covers t: the request's ``logprobs`` input)
    r_t     = exp(log p_t − log q_t)
    loss    = Σ_t [ −sg(min(r_t, c)) · A_t · log p_t  +  kl_coeff · ½ (log p_t − log q_t)² ]

    ∇loss   = Σ_t [ −min(r_t, c) · A_t  +  kl_coeff · (log p_t − log q_t) ] ∇log p_t

Untruncated, the first term's gradient equals importance sampling's (−r·A·∇log p); truncating
the detached weight at ``c`` bounds each token's step under heavy off-policyness (truncated IS
as in IMPALA / Yao et al. 2025, whose C = 2 is our default ``clip_high_threshold``), while
never zeroing a token's gradient the way PPO's clip does. ``kl_coeff`` (default 0) adds the
k2 estimate of KL(q‖p), pulling the trainer towards the behaviour policy.
Metrics: ``importance_ratio:mean``, ``clip_fraction:mean`` (r > c), ``recorded_fraction:mean``
(active positions scored against recorded rather than client-sent logprobs).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from loraplex.domain.work import RECORDED_LOGPROBS_KEY
from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.ratio import (
    loss_output,
    masked_log_ratio,
    masked_mean,
    policy_positions,
)
from loraplex.errors import user_error


def behaviour_logprobs(tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log q [T], is_recorded [T])``: recorded logprobs where present, else ``logprobs``.

    Positions with neither (NaN recorded and no ``logprobs``) get 0; validation guarantees
    they carry no advantage.
    """
    recorded = tensors.get(RECORDED_LOGPROBS_KEY)
    sent = tensors.get("logprobs")
    if recorded is None:
        assert sent is not None, "validation requires logprobs or recorded_logprobs"
        return sent, torch.zeros_like(sent, dtype=torch.bool)
    is_recorded = ~torch.isnan(recorded)
    fallback = sent if sent is not None else torch.zeros_like(recorded)
    return torch.where(is_recorded, recorded, fallback), is_recorded


def stable_reinforce(logprobs: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """Σ −sg(min(r, c))·A·logp + kl_coeff·½·(logp − logq)² over positions with A ≠ 0."""
    truncation = inputs.config["clip_high_threshold"]
    kl_coeff = inputs.config["kl_coeff"]
    logp, advantages, active = policy_positions(logprobs, inputs)
    logq, is_recorded = behaviour_logprobs(inputs.tensors)
    log_ratio = masked_log_ratio(logp, logq, active)
    ratio = log_ratio.exp()
    weight = ratio.clamp(max=truncation).detach()
    objective = weight * advantages * logp - 0.5 * kl_coeff * log_ratio.square()
    elementwise = torch.where(active, -objective, 0.0)
    return loss_output(
        elementwise,
        {
            "importance_ratio:mean": masked_mean(ratio, active, empty=1.0),
            "clip_fraction:mean": masked_mean((ratio > truncation).float(), active, empty=0.0),
            "recorded_fraction:mean": masked_mean(is_recorded.float(), active, empty=0.0),
        },
    )


def check_behaviour_logprobs(index: int, tensors: Mapping[str, torch.Tensor]) -> None:
    """Every position with a non-zero advantage needs a behaviour logprob."""
    recorded = tensors.get(RECORDED_LOGPROBS_KEY)
    if "logprobs" in tensors:
        return
    if recorded is None:
        raise user_error(
            f"data[{index}].loss_fn_inputs.logprobs",
            "missing: stable_reinforce needs the sampling logprobs, either recorded by a "
            "record_stability_info sampler (provenance spans) or sent as a 'logprobs' input",
        )
    uncovered = torch.nonzero(torch.isnan(recorded) & (tensors["advantages"] != 0))
    if uncovered.numel():
        raise user_error(
            f"data[{index}].loss_fn_input_spans",
            f"position {int(uncovered[0])} has a non-zero advantage but no provenance span with "
            "recorded logprobs covers it, and no 'logprobs' input was sent",
        )


SPEC = LossSpec(
    name="stable_reinforce",
    fn=stable_reinforce,
    required_inputs=("advantages",),
    optional_inputs=("logprobs", RECORDED_LOGPROBS_KEY),
    config_defaults={"clip_high_threshold": 2.0, "kl_coeff": 0.0},
    nan_allowed_inputs=frozenset({RECORDED_LOGPROBS_KEY}),
    check_datum=check_behaviour_logprobs,
)
