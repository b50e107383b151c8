"""One RL step's wall clock under sync, async-k and disaggregated execution, and where the
rented GPU-seconds go.

Phases (seconds, each on the GPUs that run it): prefill + decode (rollout GPU work), the
environment (sandbox/VM/tool latency on the rollout critical path; GPUs idle unless training
fills the gap), training, and a fixed per-step overhead (weight sync, optimizer, bookkeeping).

* ``sync``: ``rollout + env + train + fixed``.
* ``async`` (co-located, rollouts at most ``k`` policy versions stale): training of step s runs
  in the environment gaps of later steps, and ``k`` steps' rollouts can be in flight:
  ``max(rollout + train, (rollout + env) / k) + fixed``; k = 1 is the usual 1-step async.
  (Batching several steps' decodes together would amortise weight reads further; not modelled.)
* ``disaggregated``: rollout and trainer pools, each timed on its own GPUs:
  ``max(rollout, (rollout + env) / k, train) + fixed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loraplex.errors import user_error

ModeKind = Literal["sync", "async", "disaggregated"]
MODE_KINDS: tuple[ModeKind, ...] = ("sync", "async", "disaggregated")


@dataclass(frozen=True)
class StepPhases:
    """Seconds per step of each phase, and the GPUs each runs on."""

    prefill_s: float
    decode_weights_s: float
    decode_kv_s: float
    train_s: float
    env_s: float
    fixed_s: float
    rollout_gpus: int
    trainer_gpus: int

    @property
    def rollout_s(self) -> float:
        return self.prefill_s + self.decode_weights_s + self.decode_kv_s


@dataclass(frozen=True)
class StepCost:
    """Wall clock of one step and its GPU-seconds by cause (they sum to ``wall_s × GPUs``)."""

    wall_s: float
    num_gpus: int
    prefill_gpu_s: float
    decode_weights_gpu_s: float
    decode_kv_gpu_s: float
    train_gpu_s: float
    env_idle_gpu_s: float
    fixed_gpu_s: float

    @property
    def utilization(self) -> float:
        """Share of rented GPU time spent computing (prefill, decode, training)."""
        busy = (self.prefill_gpu_s + self.decode_weights_gpu_s + self.decode_kv_gpu_s
                + self.train_gpu_s)
        return busy / (self.wall_s * self.num_gpus) if self.wall_s > 0 else 0.0


def step_wall_seconds(phases: StepPhases, mode: ModeKind, async_steps: int = 1) -> float:
    """Wall seconds of one steady-state step (formulas in the module docstring)."""
    if mode not in MODE_KINDS:
        raise user_error("mode", f"expected one of {MODE_KINDS}, got {mode!r}")
    if async_steps < 1:
        raise user_error("async_steps", f"must be ≥ 1, got {async_steps}")
    rollout, env, train = phases.rollout_s, phases.env_s, phases.train_s
    if mode == "sync":
        busy = rollout + env + train
    elif mode == "async":
        busy = max(rollout + train, (rollout + env) / async_steps)
    else:
        busy = max(rollout, (rollout + env) / async_steps, train)
    return busy + phases.fixed_s


def step_cost(phases: StepPhases, mode: ModeKind, async_steps: int = 1) -> StepCost:
    """Attribute one step's rented GPU-seconds to phases; whatever no phase uses is idle
    (environment waits not hidden, or a pool waiting for the other)."""
    wall = step_wall_seconds(phases, mode, async_steps)
    if mode == "disaggregated":
        num_gpus = phases.rollout_gpus + phases.trainer_gpus
    else:
        num_gpus = phases.rollout_gpus
    r, t = phases.rollout_gpus, phases.trainer_gpus
    busy = phases.rollout_s * r + phases.train_s * t
    fixed = phases.fixed_s * num_gpus
    return StepCost(
        wall_s=wall, num_gpus=num_gpus,
        prefill_gpu_s=phases.prefill_s * r, decode_weights_gpu_s=phases.decode_weights_s * r,
        decode_kv_gpu_s=phases.decode_kv_s * r, train_gpu_s=phases.train_s * t,
        env_idle_gpu_s=wall * num_gpus - busy - fixed, fixed_gpu_s=fixed)
