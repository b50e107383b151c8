"""One AdamW step for one adapter, with Tinker's `AdamParams` (the same update as
``torch.optim.AdamW``; weight decay decoupled, default 0; ``grad_clip_norm`` 0 = no clipping).

Order per step, as torch does it: global L2 grad norm over the adapter's tensors → optional
clipping exactly like ``torch.nn.utils.clip_grad_norm_`` (`grad_clip.clip_gradients`) →
step += 1 → decoupled decay, moments, bias-corrected
update. Two bitwise-checked implementations:

- ``fused`` (default): ``torch._fused_adamw_`` over the adapter's tensor list, bitwise equal to
  ``torch.optim.AdamW(fused=True)``; the step tensor is incremented *before* the call (the
  kernel reads it for bias correction and would divide by zero at step 0).
- ``foreach``: torch's multi-tensor algorithm op for op, bitwise equal to the default
  ``torch.optim.AdamW`` (foreach and for-loop give identical numbers); fused differs from it by
  fp32 rounding (~1e-7 relative).

Knows nothing of adapters, banks or which tensors are trainable: tensors in, metrics out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from loraplex.domain.optim import AdamParams
from loraplex.engine.optim.grad_clip import clip_gradients
from loraplex.engine.optim.optimizer_state import OptimizerState

Implementation = Literal["fused", "foreach"]


def adamw_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: OptimizerState,
    adam: AdamParams,
    implementation: Implementation = "fused",
    total_norm: torch.Tensor | None = None,
) -> dict[str, float]:
    """Update ``params`` in place from ``grads`` (clipped in place when clipping is on).

    Args:
        params: the adapter's trainable tensors, in ``state.names`` order (plain tensors or
            views of a bank; updated under no_grad).
        grads: their accumulated gradients, same order and shapes.
        state: the adapter's moments and step count, updated in place.
        adam: learning rate, betas, eps, decoupled weight decay, grad_clip_norm (0 = off).
        implementation: ``fused`` or ``foreach`` (see the module docstring).
        total_norm: the gradients' global L2 norm when they are a share of the adapter's (a
            pipeline stage's); None: computed here from ``grads``.

    Returns:
        ``grad_norm:mean`` (global L2 norm before clipping), ``learning_rate:mean``.

    Raises:
        UserError: invalid AdamParams, or a non-finite gradient norm; nothing is changed.
    """
    adam.validate()
    if not len(params) == len(grads) == len(state.exp_avg):
        raise ValueError("params, grads and state must list the same tensors")
    with torch.no_grad():
        grads = list(grads)
        norm = clip_gradients(grads, adam.grad_clip_norm, total_norm)
        state.step.add_(1.0)
        if params:
            update = fused_update if implementation == "fused" else foreach_update
            update(list(params), grads, state, adam)
    return {"grad_norm:mean": norm, "learning_rate:mean": adam.learning_rate}


def fused_update(
    params: list[torch.Tensor], grads: list[torch.Tensor], state: OptimizerState, adam: AdamParams
) -> None:
    """``torch._fused_adamw_``; every tensor shares the adapter's (already incremented) step."""
    torch._fused_adamw_(
        params,
        grads,
        state.exp_avg,
        state.exp_avg_sq,
        [],
        [state.step] * len(params),
        lr=adam.learning_rate,
        beta1=adam.beta1,
        beta2=adam.beta2,
        weight_decay=adam.weight_decay,
        eps=adam.eps,
        amsgrad=False,
        maximize=False,
    )


def foreach_update(
    params: list[torch.Tensor], grads: list[torch.Tensor], state: OptimizerState, adam: AdamParams
) -> None:
    """torch.optim's ``_multi_tensor_adam`` (decoupled decay, not capturable), op for op."""
    lr, beta1, beta2 = adam.learning_rate, adam.beta1, adam.beta2
    step = state.step.item()
    if adam.weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * adam.weight_decay)
    torch._foreach_lerp_(state.exp_avg, grads, 1 - beta1)
    torch._foreach_mul_(state.exp_avg_sq, beta2)
    torch._foreach_addcmul_(state.exp_avg_sq, grads, grads, 1 - beta2)
    # Python-float scalars, computed exactly as torch does (double precision, then rounded).
    step_size = (lr / (1 - beta1**step)) * -1
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denominator = torch._foreach_sqrt(state.exp_avg_sq)
    torch._foreach_div_(denominator, bias_correction2_sqrt)
    torch._foreach_add_(denominator, adam.eps)
    torch._foreach_addcdiv_(params, state.exp_avg, denominator, step_size)
