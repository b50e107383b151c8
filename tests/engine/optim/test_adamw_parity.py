"""Our per-adapter AdamW == ``torch.optim.AdamW`` (+ ``clip_grad_norm_``) over 20 steps, bitwise.

``foreach`` is compared with torch's default AdamW (its for-loop and foreach paths agree
bitwise), ``fused`` with ``torch.optim.AdamW(fused=True)``; fused and default differ only by
fp32 rounding, checked with a tolerance.
"""

from __future__ import annotations

import pytest
import torch

from loraplex.domain.optim import AdamParams
from loraplex.engine.optim.adamw import Implementation, adamw_step
from loraplex.engine.optim.optimizer_state import OptimizerState

SHAPES = [(16, 64), (64, 16), (4, 32), (32, 4), (7,)]
STEPS = 20
CONFIGS = [
    AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-12),  # Tinker defaults
    AdamParams(learning_rate=3e-2, beta1=0.8, beta2=0.999, eps=1e-8, weight_decay=0.1,
               grad_clip_norm=1.0),
    AdamParams(learning_rate=1e-4, beta1=0.5, beta2=0.9, eps=1e-6, weight_decay=0.01,
               grad_clip_norm=0.5),
    AdamParams(learning_rate=5e-3, beta1=0.0, beta2=0.0, eps=1e-3, grad_clip_norm=1e6),
]  # fmt: skip


def problem(seed: int = 0) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Initial params and STEPS rounds of random grads (norms around 10, so clipping bites)."""
    generator = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=generator) for s in SHAPES]
    grads = [[torch.randn(s, generator=generator) * 3 for s in SHAPES] for _ in range(STEPS)]
    return params, grads


def reference(adam: AdamParams, fused: bool) -> tuple[list[torch.Tensor], list[float]]:
    """torch.optim.AdamW with clip_grad_norm_: final params and each step's pre-clip norm."""
    params0, rounds = problem()
    params = [torch.nn.Parameter(p.clone()) for p in params0]
    optimizer = torch.optim.AdamW(
        params,
        lr=adam.learning_rate,
        betas=(adam.beta1, adam.beta2),
        eps=adam.eps,
        weight_decay=adam.weight_decay,
        foreach=False if not fused else None,
        fused=fused or None,
    )
    norms = []
    for grads in rounds:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        if adam.grad_clip_norm > 0:
            norms.append(torch.nn.utils.clip_grad_norm_(params, adam.grad_clip_norm).item())
        else:
            norms.append(torch.nn.utils.get_total_norm(list(grads)).item())
        optimizer.step()
    return [p.detach() for p in params], norms


def ours(
    adam: AdamParams, implementation: Implementation
) -> tuple[list[torch.Tensor], list[float]]:
    params, rounds = problem()
    state = OptimizerState.zeros([f"t{i}" for i in range(len(params))], params)
    norms = []
    for grads in rounds:
        metrics = adamw_step(params, [g.clone() for g in grads], state, adam, implementation)
        assert metrics["learning_rate:mean"] == adam.learning_rate
        norms.append(metrics["grad_norm:mean"])
    assert state.num_steps == STEPS
    return params, norms


@pytest.mark.parametrize("adam", CONFIGS)
@pytest.mark.parametrize(("implementation", "torch_fused"), [("foreach", False), ("fused", True)])
def test_bitwise_equal_to_torch_adamw(
    adam: AdamParams, implementation: Implementation, torch_fused: bool
) -> None:
    expected, expected_norms = reference(adam, fused=torch_fused)
    got, norms = ours(adam, implementation)
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)
    assert norms == pytest.approx(expected_norms, rel=1e-6)


@pytest.mark.parametrize("adam", CONFIGS)
def test_fused_close_to_default_torch_adamw(adam: AdamParams) -> None:
    expected, _ = reference(adam, fused=False)
    got, _ = ours(adam, "fused")
    worst = max((e - g).abs().max().item() for e, g in zip(expected, got, strict=True))
    assert worst <= 1e-6  # params are O(1); measured ≤ 2.4e-7


def test_clipping_matches_clip_grad_norm_and_scales_grads_in_place() -> None:
    # A norm of 5e-4 makes clip_grad_norm_'s 1e-6 epsilon visible in the coefficient.
    grads = [torch.tensor([3e-4, 4e-4]), torch.tensor([[0.0]])]
    reference_params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(reference_params, grads, strict=True):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(reference_params, 1e-4)
    params = [torch.zeros_like(g) for g in grads]
    state = OptimizerState.zeros(["w", "v"], params)
    metrics = adamw_step(params, grads, state, AdamParams(learning_rate=0.1, grad_clip_norm=1e-4))
    assert metrics["grad_norm:mean"] == pytest.approx(5e-4)
    for p, g in zip(reference_params, grads, strict=True):
        assert p.grad is not None and torch.equal(p.grad, g)
    torch.testing.assert_close(state.exp_avg[0], 0.1 * grads[0])  # the update saw clipped grads


def test_no_clipping_leaves_grads_untouched() -> None:
    params, grads = [torch.zeros(2)], [torch.tensor([3.0, 4.0])]
    adamw_step(params, grads, OptimizerState.zeros(["w"], params), AdamParams(grad_clip_norm=0.0))
    assert grads[0].tolist() == [3.0, 4.0]


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
def test_updates_views_of_a_bank_and_leaves_other_slots_alone(
    implementation: Implementation,
) -> None:
    generator = torch.Generator().manual_seed(5)
    bank_a = torch.randn(4, 8, 16, generator=generator)  # slot × rank × dim
    bank_b = torch.randn(4, 16, 8, generator=generator)
    grad_a, grad_b = torch.randn_like(bank_a), torch.randn_like(bank_b)
    before = bank_a.clone(), bank_b.clone()
    slot = 2
    params = [bank_a[slot], bank_b[slot]]
    state = OptimizerState.zeros(["a", "b"], params)
    adam = AdamParams(learning_rate=1e-2, weight_decay=0.1, grad_clip_norm=1.0)
    separate_grads = [grad_a[slot].clone(), grad_b[slot].clone()]  # clipping scales in place
    adamw_step(params, [grad_a[slot], grad_b[slot]], state, adam, implementation)
    separate = [before[0][slot].clone(), before[1][slot].clone()]
    separate_state = OptimizerState.zeros(["a", "b"], separate)
    adamw_step(separate, separate_grads, separate_state, adam, implementation)
    assert torch.equal(bank_a[slot], separate[0]) and torch.equal(bank_b[slot], separate[1])
    others = [s for s in range(4) if s != slot]
    assert torch.equal(bank_a[others], before[0][others])
    assert torch.equal(bank_b[others], before[1][others])
