"""Step wall clock in sync / async-k / disaggregated modes and GPU-second attribution."""

from __future__ import annotations

import pytest

from loraplex.cost.step import StepPhases, step_cost, step_wall_seconds
from loraplex.errors import UserError

# Rollout GPU work 1 + 2 + 3 = 6 s, training 4 s, environment 10 s, fixed 1 s, 8 GPUs.
PHASES = StepPhases(prefill_s=1, decode_weights_s=2, decode_kv_s=3, train_s=4, env_s=10,
                    fixed_s=1, rollout_gpus=8, trainer_gpus=8)


def test_sync_adds_every_phase() -> None:
    assert step_wall_seconds(PHASES, "sync") == 6 + 10 + 4 + 1


def test_one_step_async_hides_training_in_environment_waits() -> None:
    assert step_wall_seconds(PHASES, "async") == 6 + max(10, 4) + 1
    busy_trainer = StepPhases(1, 2, 3, 20, 10, 1, 8, 8)
    assert step_wall_seconds(busy_trainer, "async") == 6 + 20 + 1


def test_async_k_overlaps_k_steps_of_rollouts() -> None:
    # max(GPU work 6 + 4, rollout critical path (6 + 10) / 2) + 1.
    assert step_wall_seconds(PHASES, "async", async_steps=2) == 10 + 1
    assert step_wall_seconds(PHASES, "async", async_steps=4) == 10 + 1


def test_disaggregated_pools_run_side_by_side() -> None:
    phases = StepPhases(1, 2, 3, 20, 10, 1, rollout_gpus=8, trainer_gpus=4)
    assert step_wall_seconds(phases, "disaggregated") == max(6, 16, 20) + 1
    cost = step_cost(phases, "disaggregated")
    assert cost.num_gpus == 12
    assert cost.train_gpu_s == 80 and cost.decode_kv_gpu_s == 24
    assert cost.env_idle_gpu_s == 21 * 12 - (6 * 8 + 20 * 4) - 12


def test_gpu_seconds_sum_to_the_rented_time() -> None:
    cost = step_cost(PHASES, "async")
    assert cost.wall_s == 17 and cost.num_gpus == 8
    assert (cost.prefill_gpu_s, cost.decode_weights_gpu_s, cost.decode_kv_gpu_s,
            cost.train_gpu_s, cost.fixed_gpu_s) == (8, 16, 24, 32, 8)
    # Environment 10 s, of which training hides 4: 6 idle seconds on 8 GPUs.
    assert cost.env_idle_gpu_s == 48
    assert cost.utilization == pytest.approx(80 / 136)


def test_bad_modes() -> None:
    with pytest.raises(UserError, match="mode"):
        step_wall_seconds(PHASES, "eventually")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="async_steps"):
        step_wall_seconds(PHASES, "async", async_steps=0)
