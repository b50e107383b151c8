"""AdamW state: exact save/restore through safetensors, layout checks, and refusal to step on
bad input without changing anything."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load, save

from loraplex.domain.optim import AdamParams
from loraplex.engine.optim.adamw import Implementation, adamw_step
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.errors import UserError

NAMES = ["layers.0.q_proj.lora_A", "layers.0.q_proj.lora_B", "unembed_tokens.lora_A"]
SHAPES = [(4, 32), (32, 4), (4, 32)]
ADAM = AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01,
                  grad_clip_norm=1.0)  # fmt: skip


def grads_for(step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=generator) for s in SHAPES]


def fresh_params() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(s, generator=generator) for s in SHAPES]


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
def test_training_continued_after_round_trip_is_bitwise_identical(
    implementation: Implementation,
) -> None:
    uninterrupted = fresh_params()
    state = OptimizerState.zeros(NAMES, uninterrupted)
    for step in range(20):
        adamw_step(uninterrupted, grads_for(step), state, ADAM, implementation)

    first_half = fresh_params()
    state = OptimizerState.zeros(NAMES, first_half)
    for step in range(10):
        adamw_step(first_half, grads_for(step), state, ADAM, implementation)
    saved_params = save({n: p for n, p in zip(NAMES, first_half, strict=True)})
    saved_state = save(state.state_dict())
    del first_half, state

    loaded = load(saved_params)
    resumed = [loaded[n] for n in NAMES]
    restored = OptimizerState.from_state_dict(load(saved_state), NAMES, resumed)
    assert restored.num_steps == 10
    for step in range(10, 20):
        adamw_step(resumed, grads_for(step), restored, ADAM, implementation)
    for a, b in zip(uninterrupted, resumed, strict=True):
        assert torch.equal(a, b)


def test_state_dict_names_are_stable_and_copies() -> None:
    params = fresh_params()
    state = OptimizerState.zeros(NAMES, params)
    adamw_step(params, grads_for(0), state, ADAM)
    tensors = state.state_dict()
    assert set(tensors) == {"step"} | {f"exp_avg.{n}" for n in NAMES} | {
        f"exp_avg_sq.{n}" for n in NAMES
    }
    assert tensors["step"].item() == 1.0 and tensors["step"].dtype == torch.float32
    tensors[f"exp_avg.{NAMES[0]}"].zero_()
    assert state.exp_avg[0].abs().sum() > 0
    assert state.nbytes == 2 * 4 * sum(math.prod(s) for s in SHAPES) + 4


def test_restore_rejects_a_different_layout() -> None:
    params = fresh_params()
    tensors = OptimizerState.zeros(NAMES, params).state_dict()
    missing = dict(tensors)
    del missing[f"exp_avg_sq.{NAMES[1]}"]
    with pytest.raises(UserError) as info:
        OptimizerState.from_state_dict(missing, NAMES, params)
    assert info.value.field == f"optimizer_state.exp_avg_sq.{NAMES[1]}"
    reshaped = dict(tensors, **{f"exp_avg.{NAMES[0]}": torch.zeros(8, 32)})
    with pytest.raises(UserError) as info:
        OptimizerState.from_state_dict(reshaped, NAMES, params)
    assert info.value.field == f"optimizer_state.exp_avg.{NAMES[0]}"
    extra = dict(tensors, **{"exp_avg.other": torch.zeros(1)})
    with pytest.raises(UserError) as info:
        OptimizerState.from_state_dict(extra, NAMES, params)
    assert info.value.field == "optimizer_state.exp_avg.other"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_gradient_changes_nothing(bad: float) -> None:
    params = fresh_params()
    state = OptimizerState.zeros(NAMES, params)
    adamw_step(params, grads_for(0), state, ADAM)
    before = [p.clone() for p in params], state.state_dict()
    grads = grads_for(1)
    grads[2][0, 0] = bad
    with pytest.raises(UserError, match="gradient norm"):
        adamw_step(params, grads, state, ADAM)
    assert all(torch.equal(a, b) for a, b in zip(before[0], params, strict=True))
    after = state.state_dict()
    assert all(torch.equal(before[1][k], after[k]) for k in after)


def test_invalid_adam_params_rejected_before_any_change() -> None:
    params = fresh_params()
    state = OptimizerState.zeros(NAMES, params)
    with pytest.raises(UserError) as info:
        adamw_step(params, grads_for(0), state, AdamParams(beta1=1.0))
    assert info.value.field == "adam_params.beta1"
    assert state.num_steps == 0


def test_first_step_uses_step_one() -> None:
    # Step 1 of Adam moves each weight by −lr·sign(g) (bias-corrected m/√v = g/|g|).
    params = [torch.zeros(3)]
    state = OptimizerState.zeros(["w"], params)
    adamw_step(params, [torch.tensor([2.0, -0.5, 1e-3])], state, AdamParams(learning_rate=0.1))
    torch.testing.assert_close(params[0], torch.tensor([-0.1, 0.1, -0.1]))
    assert state.num_steps == 1
