"""One Dimuon step for one adapter, with Tinker's `DimuonParams`.

Tinker documents Dimuon by its parameters: momentum (``beta1``), a row and column preconditioner
smoothed by ``damping``, a matrix-sign step, a learning rate "applied to a direction with
Frobenius norm sqrt(rank)" and a rank correction "relative to rank 32", uniform over the LoRA
matrices; the iteration count and the normalisation epsilon are internal. This is that update,
per LoRA matrix ``W`` (``[d_out, r]`` or ``[r, d_in]``; the leading layer and expert axes of a
leaf are a batch of independent matrices):

1. Clip: the adapter's global L2 grad norm, as `adamw` does (`grad_clip.clip_gradients`,
   ``torch.nn.utils.clip_grad_norm_``'s arithmetic; ``grad_clip_norm`` ≤ 0: off).
2. Momentum: ``M ← β₁·M + (1 − β₁)·G``.
3. Preconditioner: ``X = M / (‖M‖_F + ε)``; row energies ``ρᵢ = m·Σⱼ Xᵢⱼ²`` and column
   energies ``γⱼ = n·Σᵢ Xᵢⱼ²`` (each averages 1); ``Y = diag(ρ + δ)^-½ · X · diag(γ + δ)^-½``,
   Adafactor's factored second moment taken from the momentum itself, damped by ``δ``.
4. Matrix sign: ``O ≈ U·Vᵀ`` of ``Y = U·Σ·Vᵀ`` by `NS_STEPS` quintic Newton–Schulz iterations
   (Muon's coefficients) on ``Y / (‖Y‖_F + ε)``, in float32, carried out on the ``r × r`` Gram
   matrix of the smaller dimension (`matrix_sign`).
5. Direction ``D = O · √r / (‖O‖_F + ε)``: Frobenius norm √r exactly, whatever the iteration
   left of the singular values (0 where ``M`` is 0, as for A at the first step, when B is 0).
6. ``W ← W − η·(32 / r)^κ · D`` with ``η`` = ``learning_rate`` and ``κ`` =
   ``rank_lr_correction_exponent``. No weight decay: `DimuonParams` has none.

Our choices where Tinker publishes none: `NS_STEPS` = 5, `EPSILON` = 1e-7, the exponents −½ of
the preconditioner and the energies normalised to mean 1 (so ``damping`` is relative).
Knows nothing of adapters or banks: tensors in, metrics out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from loraplex.domain.optim import DimuonParams
from loraplex.engine.optim.grad_clip import clip_gradients
from loraplex.engine.optim.optimizer_state import OptimizerState

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Muon's quintic (Keller Jordan, 2024)
NS_STEPS = 5
EPSILON = 1e-7
RANK_REFERENCE = 32


def dimuon_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: OptimizerState,
    dimuon: DimuonParams,
    rank: int,
    total_norm: torch.Tensor | None = None,
) -> dict[str, float]:
    """Update ``params`` in place from ``grads`` (clipped in place when clipping is on).

    Args:
        params: the adapter's LoRA leaves (``[..., m, n]``), in ``state.names`` order.
        grads: their accumulated gradients, same order and shapes.
        state: the adapter's Dimuon momentum and step count, updated in place.
        dimuon: learning rate, grad_clip_norm, beta1, damping, rank correction exponent.
        rank: the adapter's LoRA rank r.
        total_norm: the gradients' global L2 norm when they are a share of the adapter's (a
            pipeline stage's); None: computed here from ``grads``.

    Returns:
        ``grad_norm:mean`` (global L2 norm before clipping), ``learning_rate:mean`` (as given).

    Raises:
        UserError: invalid DimuonParams, or a non-finite gradient norm; nothing is changed.
    """
    dimuon.validate()
    if state.family != "dimuon" or not len(params) == len(grads) == len(state.exp_avg):
        raise ValueError("a Dimuon state listing the same tensors as params and grads")
    with torch.no_grad():
        grads = list(grads)
        norm = clip_gradients(grads, dimuon.grad_clip_norm, total_norm)
        state.step.add_(1.0)
        lr = dimuon.learning_rate * (RANK_REFERENCE / rank) ** dimuon.rank_lr_correction_exponent
        for param, grad, momentum in zip(params, grads, state.exp_avg, strict=True):
            momentum.lerp_(grad, 1 - dimuon.beta1)
            param.sub_(direction(momentum, dimuon.damping, rank), alpha=lr)
    return {"grad_norm:mean": norm, "learning_rate:mean": dimuon.learning_rate}


def direction(momentum_X_M_N: torch.Tensor, damping: float, rank: int) -> torch.Tensor:
    """Steps 3-5 of the module docstring for a batch ``[..., m, n]`` of momentum matrices."""
    scale_X_1_1 = torch.linalg.matrix_norm(momentum_X_M_N, keepdim=True)
    x_X_M_N = momentum_X_M_N / (scale_X_1_1 + EPSILON)
    rows, cols = x_X_M_N.shape[-2:]
    energy_X_M_N = x_X_M_N.square()
    row_X_M_1 = energy_X_M_N.sum(-1, keepdim=True) * rows
    col_X_1_N = energy_X_M_N.sum(-2, keepdim=True) * cols
    y_X_M_N = x_X_M_N * (row_X_M_1 + damping).rsqrt() * (col_X_1_N + damping).rsqrt()
    sign_X_M_N = matrix_sign(y_X_M_N)
    size_X_1_1 = torch.linalg.matrix_norm(sign_X_M_N, keepdim=True)
    d_X_M_N = sign_X_M_N * (math.sqrt(rank) / (size_X_1_1 + EPSILON))
    return torch.where(scale_X_1_1 > 0, d_X_M_N, torch.zeros_like(d_X_M_N))


def matrix_sign(y_X_M_N: torch.Tensor) -> torch.Tensor:
    """``U·Vᵀ`` of each matrix, approximately: `NS_STEPS` quintic Newton-Schulz iterations
    (singular values land near 1, in about [0.7, 1.2], not exactly on it).

    Each iteration ``x ← (a·I + b·G + c·G²)·x`` with ``G = x·xᵀ`` left-multiplies ``x`` by a
    polynomial of its Gram matrix, so it runs on the Gram side: ``x_k = Q_k·x₀`` with
    ``Q ← P·Q`` and ``G ← P·G·P`` (``P`` symmetric), all ``r × r`` for a rank-r LoRA matrix, and
    one ``Q·x₀`` at the end: the same polynomial as iterating on ``x`` (up to rounding) at a
    fraction of the cost (two ``r × n`` products instead of ten)."""
    a, b, c = NS_COEFFICIENTS
    wide = y_X_M_N.shape[-2] <= y_X_M_N.shape[-1]
    x0 = y_X_M_N if wide else y_X_M_N.mT
    x0 = x0 / (torch.linalg.matrix_norm(x0, keepdim=True) + EPSILON)
    gram_X_R_R = x0 @ x0.mT
    eye_R_R = torch.eye(gram_X_R_R.shape[-1], dtype=x0.dtype, device=x0.device)
    q_X_R_R = eye_R_R.expand_as(gram_X_R_R)
    for _ in range(NS_STEPS):
        p_X_R_R = a * eye_R_R + b * gram_X_R_R + c * gram_X_R_R @ gram_X_R_R
        q_X_R_R = p_X_R_R @ q_X_R_R
        gram_X_R_R = p_X_R_R @ gram_X_R_R @ p_X_R_R
    x = q_X_R_R @ x0
    return x if wide else x.mT
