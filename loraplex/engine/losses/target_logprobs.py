"""``log p(target | prefix)`` from logits, for ``[T]`` targets and top-K ``[T, K]`` targets.

The one place that turns logits into the ``logprobs`` every loss consumes. Computes
``logit[target] − logsumexp(logits)`` in float32 without materialising the ``[T, V]``
log-softmax.
"""

from __future__ import annotations

import torch


def target_logprobs(logits_T_V: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of ``target_tokens`` (``[T]`` or ``[T, K]``) under ``logits_T_V``.

    Returns a float32 tensor of the targets' shape, differentiable w.r.t. the logits.
    """
    logits = logits_T_V.float()
    index_T_K = target_tokens.reshape(target_tokens.shape[0], -1)
    picked_T_K = logits.gather(-1, index_T_K)
    logprobs_T_K = picked_T_K - torch.logsumexp(logits, dim=-1, keepdim=True)
    return logprobs_T_K.reshape(target_tokens.shape)
