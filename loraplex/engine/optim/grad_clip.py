"""The adapter's global gradient norm and its clipping, shared by every optimizer family:
exactly ``torch.nn.utils.clip_grad_norm_`` (coefficient ``min(max_norm / (norm + 1e-6), 1)``),
and a non-finite norm refused before anything changes."""

from __future__ import annotations

import math

import torch

from loraplex.errors import user_error

CLIP_EPSILON = 1e-6  # the epsilon of torch.nn.utils.clip_grad_norm_


def clip_gradients(grads: list[torch.Tensor], max_norm: float,
                   total_norm: torch.Tensor | None = None) -> float:
    """Scale ``grads`` in place to global L2 norm ``max_norm`` when it is exceeded (``max_norm``
    ≤ 0: no clipping); returns the norm before clipping.

    Args:
        total_norm: the gradients' global norm when they are a share of the adapter's (a
            pipeline stage's); None: computed here from ``grads``.

    Raises:
        UserError: the norm is not finite (nothing is changed).
    """
    if total_norm is None:
        total_norm = torch.nn.utils.get_total_norm(grads)
    norm = float(total_norm)
    if not math.isfinite(norm):
        raise user_error(
            "optim_step", f"gradient norm is {norm}; the update was skipped, weights unchanged"
        )
    if max_norm > 0:
        clip_coef = max_norm / (total_norm + CLIP_EPSILON)
        torch._foreach_mul_(grads, torch.clamp(clip_coef, max=1.0))
    return norm
