"""`dimuon_step` against an independent float64 reference of the documented update, the
direction's invariants (Frobenius √r, near the exact polar factor, 0 for zero momentum), clipping,
rank correction, stage-split invariance and a bitwise resume through `OptimizerState`."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from loraplex.domain.optim import DimuonParams
from loraplex.engine.optim.dimuon import NS_COEFFICIENTS, NS_STEPS, dimuon_step, direction
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.errors import UserError

RANK = 4
NAMES = ["q.lora_A", "q.lora_B"]


def leaves(seed: int = 0) -> list[torch.Tensor]:
    """An A ``[layers, r, d_in]`` and a B ``[layers, d_out, r]`` leaf of two layers."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, RANK, 24, generator=gen), torch.randn(2, 16, RANK, generator=gen)]


def reference_direction(m: np.ndarray, damping: float, rank: int) -> np.ndarray:
    """The module docstring's steps 3-5 for one matrix, in float64 numpy."""
    scale = np.linalg.norm(m)
    if scale == 0:
        return np.zeros_like(m)
    x = m / (scale + 1e-7)
    rows, cols = x.shape
    row = (x**2).sum(1, keepdims=True) * rows
    col = (x**2).sum(0, keepdims=True) * cols
    y = x / np.sqrt(row + damping) / np.sqrt(col + damping)
    wide = rows <= cols
    z = y if wide else y.T
    z = z / (np.linalg.norm(z) + 1e-7)
    a, b, c = NS_COEFFICIENTS
    for _ in range(NS_STEPS):
        g = z @ z.T
        z = a * z + (b * g + c * g @ g) @ z
    o = z if wide else z.T
    return o * math.sqrt(rank) / (np.linalg.norm(o) + 1e-7)


def reference_steps(params, grads_per_step, hp: DimuonParams, rank: int):
    """Clip, momentum, direction, rank-corrected step, matrix by matrix, in float64."""
    ps = [p.double().numpy().copy() for p in params]
    ms = [np.zeros_like(p) for p in ps]
    lr = hp.learning_rate * (32 / rank) ** hp.rank_lr_correction_exponent
    for grads in grads_per_step:
        gs = [g.double().numpy() for g in grads]
        norm = math.sqrt(sum((g**2).sum() for g in gs))
        if hp.grad_clip_norm > 0:
            gs = [g * min(hp.grad_clip_norm / (norm + 1e-6), 1.0) for g in gs]
        for p, g, m in zip(ps, gs, ms, strict=True):
            m *= hp.beta1
            m += (1 - hp.beta1) * g
            for index in np.ndindex(p.shape[:-2]):
                p[index] -= lr * reference_direction(m[index], hp.damping, rank)
    return ps


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_three_steps_equal_the_float64_reference(clip: float) -> None:
    params = leaves(0)
    start = [p.clone() for p in params]
    grads = [leaves(s) for s in (1, 2, 3)]
    hp = DimuonParams(learning_rate=0.02, grad_clip_norm=clip, beta1=0.8, damping=1e-3)
    state = OptimizerState.zeros(NAMES, params, "dimuon")
    for step_grads in grads:
        dimuon_step(params, [g.clone() for g in step_grads], state, hp, RANK)
    expected = reference_steps(start, grads, hp, RANK)
    for got, want in zip(params, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=2e-6)
    assert state.num_steps == 3


def test_direction_has_frobenius_sqrt_rank_and_is_near_the_exact_polar_factor() -> None:
    momentum = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(5))
    d = direction(momentum, damping=1e4, rank=8)  # huge damping: a scaled identity preconditioner
    torch.testing.assert_close(torch.linalg.matrix_norm(d), torch.full((3,), math.sqrt(8)))
    u, _, vh = torch.linalg.svd(momentum, full_matrices=False)
    polar = u @ vh
    cosine = (d * polar).sum((-2, -1)) / (d.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert bool((cosine > 0.97).all()), cosine


def test_zero_momentum_moves_nothing_and_counts_the_step() -> None:
    params = leaves(0)
    before = [p.clone() for p in params]
    state = OptimizerState.zeros(NAMES, params, "dimuon")
    zero = [torch.zeros_like(p) for p in params]
    metrics = dimuon_step(params, zero, state, DimuonParams(learning_rate=1.0), RANK)
    assert all(torch.equal(a, b) for a, b in zip(params, before, strict=True))
    assert state.num_steps == 1 and metrics["grad_norm:mean"] == 0.0


def test_rank_correction_is_relative_to_rank_32() -> None:
    moved = {}
    for rank, exponent in ((32, 0.175), (8, 0.175), (8, 0.0)):
        p = [torch.zeros(1, rank, 40)]
        g = [torch.randn(1, rank, 40, generator=torch.Generator().manual_seed(1))]
        state = OptimizerState.zeros(["a"], p, "dimuon")
        hp = DimuonParams(learning_rate=0.1, beta1=0.0, rank_lr_correction_exponent=exponent)
        dimuon_step(p, g, state, hp, rank)
        moved[rank, exponent] = float(torch.linalg.matrix_norm(p[0]).squeeze())
    assert moved[32, 0.175] == pytest.approx(0.1 * math.sqrt(32), rel=1e-5)
    assert moved[8, 0.0] == pytest.approx(0.1 * math.sqrt(8), rel=1e-5)
    assert moved[8, 0.175] == pytest.approx(0.1 * math.sqrt(8) * 4**0.175, rel=1e-5)


def test_a_stage_of_the_layers_steps_bit_for_bit_like_the_whole() -> None:
    whole, grads = leaves(0), leaves(1)
    norm = torch.nn.utils.get_total_norm(grads)
    hp = DimuonParams(learning_rate=0.05, grad_clip_norm=1.0)
    dimuon_step(whole, [g.clone() for g in grads], OptimizerState.zeros(NAMES, whole, "dimuon"),
                hp, RANK)
    first = [p[:1].clone() for p in leaves(0)]
    dimuon_step(first, [g[:1].clone() for g in grads],
                OptimizerState.zeros(NAMES, first, "dimuon"), hp, RANK, total_norm=norm)
    assert all(torch.equal(a, b[:1]) for a, b in zip(first, whole, strict=True))


def test_a_restored_state_resumes_bit_for_bit() -> None:
    hp = DimuonParams(learning_rate=0.03)
    grads = [leaves(s) for s in (1, 2, 3, 4)]
    straight = leaves(0)
    state = OptimizerState.zeros(NAMES, straight, "dimuon")
    for g in grads:
        dimuon_step(straight, [t.clone() for t in g], state, hp, RANK)
    resumed = leaves(0)
    first = OptimizerState.zeros(NAMES, resumed, "dimuon")
    for g in grads[:2]:
        dimuon_step(resumed, [t.clone() for t in g], first, hp, RANK)
    saved = first.state_dict()
    assert set(saved) == {"step"} | {f"momentum.{n}" for n in NAMES}
    restored = OptimizerState.from_state_dict(saved, NAMES, resumed)
    assert restored.family == "dimuon" and restored.exp_avg_sq == []
    for g in grads[2:]:
        dimuon_step(resumed, [t.clone() for t in g], restored, hp, RANK)
    assert all(torch.equal(a, b) for a, b in zip(resumed, straight, strict=True))


@pytest.mark.parametrize(("field", "value"), [("damping", 0.0), ("beta1", 1.0),
                                              ("learning_rate", -1.0), ("damping", math.nan)])
def test_invalid_params_name_their_field_and_change_nothing(field: str, value: float) -> None:
    params = leaves(0)
    before = [p.clone() for p in params]
    state = OptimizerState.zeros(NAMES, params, "dimuon")
    hp = DimuonParams(**{"learning_rate": 0.1, field: value})
    with pytest.raises(UserError) as info:
        dimuon_step(params, leaves(1), state, hp, RANK)
    assert info.value.field == f"optimizer_params.{field}"
    assert state.num_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(params, before, strict=True))
