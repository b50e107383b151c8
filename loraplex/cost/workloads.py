"""The calculator's inputs: an RL workload, a self-hosted setup, a Tinker billing setup, and the
scenario that ties them together; plus `override`, which replaces named fields with type checks
(the one path for CLI flags and TOML workload files).

A workload is a per-step shape: ``groups_per_step × group_size`` rollouts, each ``turns`` turns
long; turn t sees context ``c_t = prompt + Σ_{j<t}(sample_j + observation_j)``, samples
``sample_tokens_per_turn`` and, except after the last turn, gets ``observation_tokens_per_turn``
back after ``env_seconds_per_turn`` of environment latency.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from loraplex.cost.pricing import BillingMode
from loraplex.cost.step import ModeKind
from loraplex.errors import user_error

T = TypeVar("T")
TrainDatums = Literal["merged", "per_turn"]
TrainTokenBasis = Literal["full_sequence", "sampled_only"]
CacheHits = Literal["none", "hit_rate", "new_tokens"]
Calibration = Literal["physical", "seed-calibrated"]


@dataclass(frozen=True)
class Workload:
    """An RL post-training run.

    Attributes:
        name: preset name.
        model: model card name (HF repo id).
        steps: RL steps (optimizer updates).
        groups_per_step: prompts per step.
        group_size: rollouts per prompt (G).
        turns: model turns per rollout.
        prompt_tokens: initial prompt length.
        sample_tokens_per_turn: generated tokens per turn (the cap, if rollouts hit it).
        observation_tokens_per_turn: tool/environment tokens appended after each non-final turn.
        env_seconds_per_turn: environment latency per turn on the rollout's critical path.
        train_datums: ``merged`` (one datum per rollout, its observations extending the
            history as a prefix) or ``per_turn`` (one datum per turn, history repeated).
        description: one line for humans.
    """

    name: str
    model: str
    steps: int
    groups_per_step: int
    group_size: int
    prompt_tokens: float
    sample_tokens_per_turn: float
    turns: int = 1
    observation_tokens_per_turn: float = 0.0
    env_seconds_per_turn: float = 0.0
    train_datums: TrainDatums = "merged"
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("steps", "groups_per_step", "group_size", "turns"):
            if getattr(self, name) < 1:
                raise user_error(f"workload.{name}", "must be ≥ 1")
        for name in ("prompt_tokens", "sample_tokens_per_turn", "observation_tokens_per_turn",
                     "env_seconds_per_turn"):
            if getattr(self, name) < 0:
                raise user_error(f"workload.{name}", "must be ≥ 0")
        if self.train_datums not in ("merged", "per_turn"):
            raise user_error("workload.train_datums", "expected 'merged' or 'per_turn'")

    @property
    def rollouts_per_step(self) -> int:
        return self.groups_per_step * self.group_size

    def contexts(self) -> tuple[float, ...]:
        """Prompt length seen at each turn, ``c_1 … c_T``."""
        step = self.sample_tokens_per_turn + self.observation_tokens_per_turn
        return tuple(self.prompt_tokens + t * step for t in range(self.turns))

    @property
    def final_length(self) -> float:
        """Tokens of a finished rollout, ``c_T + d_T``."""
        return self.contexts()[-1] + self.sample_tokens_per_turn


@dataclass(frozen=True)
class SelfHostSetup:
    """Rented GPUs running an open stack (SGLang/vLLM rollouts + a trainer).

    Attributes:
        hardware: hardware card name.
        num_gpus: GPUs rented (co-located) or rollout-pool GPUs (disaggregated); None: whole
            nodes holding one replica.
        tensor_parallel: GPUs per serving replica; None: smallest power of two that fits.
        weight_bytes_per_param: serving dtype; None: the published checkpoint's.
        usd_per_gpu_hour: None: the hardware card's default.
        decode_mbu, prefill_mfu, train_mfu: achieved fractions of peak bandwidth / FLOP/s.
        prefix_cache_hit_rate: share of a turn's history found in the KV cache (turn > 1).
        share_group_prompt: the group's prompt is prefilled once for its G rollouts.
        fixed_seconds_per_step: weight sync, optimizer and bookkeeping per step.
        mode: ``sync``, ``async`` (co-located; training fills environment gaps) or
            ``disaggregated`` (separate rollout and trainer pools); see `loraplex.cost.step`.
        async_steps: k, how many policy versions a rollout may lag (async, disaggregated).
        trainer_gpus: trainer pool size (disaggregated only).
        training: ``lora`` or ``full``.
        lora_rank: adapter rank (LoRA only).
        activation_checkpointing: +1 forward in training.
        logprob_recompute: recompute old-policy logprobs before training (+1 forward).
        reference_forward: reference-policy forward for a KL term (+1 forward).
        memory_fraction, kv_reserve: usable share of HBM; share of it kept for the KV cache
            when choosing the tensor-parallel size.
    """

    hardware: str = "h100_sxm"
    num_gpus: int | None = None
    tensor_parallel: int | None = None
    weight_bytes_per_param: float | None = None
    usd_per_gpu_hour: float | None = None
    decode_mbu: float = 0.7
    prefill_mfu: float = 0.5
    train_mfu: float = 0.4
    prefix_cache_hit_rate: float = 0.92
    share_group_prompt: bool = True
    fixed_seconds_per_step: float = 0.0
    mode: ModeKind = "async"
    async_steps: int = 1
    trainer_gpus: int | None = None
    training: Literal["lora", "full"] = "lora"
    lora_rank: int = 32
    activation_checkpointing: bool = False
    logprob_recompute: bool = False
    reference_forward: bool = False
    memory_fraction: float = 0.9
    kv_reserve: float = 0.25

    def __post_init__(self) -> None:
        if not 0.0 <= self.prefix_cache_hit_rate <= 1.0:
            raise user_error("self_host.prefix_cache_hit_rate", "must be in [0, 1]")
        if self.fixed_seconds_per_step < 0:
            raise user_error("self_host.fixed_seconds_per_step", "must be ≥ 0")
        if self.mode == "disaggregated" and not self.trainer_gpus:
            raise user_error("self_host.trainer_gpus", "needed in disaggregated mode")


@dataclass(frozen=True)
class TinkerSetup:
    """How Tinker bills the workload.

    Attributes:
        price_sheet: dated sheet name.
        tinker_model: the sheet's model name; None: the workload's model.
        billing_mode: ``per_rollout`` or ``cache_aware``; None: the sheet's own.
        cache_hits: which prompt tokens count as prefix-cache hits — ``none``; ``hit_rate``
            (that share of every prompt); ``new_tokens`` (all but never-seen tokens: the group
            prompt once per group, and observations).
        cache_hit_rate: for ``hit_rate``.
        cached_prefill_ratio: price of a hit relative to prefill; None: the sheet's.
        train_token_basis: ``full_sequence`` (what Tinker bills: every datum token) or
            ``sampled_only`` (loss tokens only; a what-if).
        checkpoints_kept, storage_months, checkpoint_bytes_per_param: adapter storage.
    """

    price_sheet: str = "tinker-2026-01-05"
    tinker_model: str | None = None
    billing_mode: BillingMode | None = None
    cache_hits: CacheHits = "none"
    cache_hit_rate: float = 0.92
    cached_prefill_ratio: float | None = None
    train_token_basis: TrainTokenBasis = "full_sequence"
    checkpoints_kept: int = 1
    storage_months: float = 1.0
    checkpoint_bytes_per_param: float = 4.0

    def __post_init__(self) -> None:
        if self.cache_hits not in ("none", "hit_rate", "new_tokens"):
            raise user_error("tinker.cache_hits", "expected 'none', 'hit_rate' or 'new_tokens'")
        if self.train_token_basis not in ("full_sequence", "sampled_only"):
            raise user_error("tinker.train_token_basis",
                             "expected 'full_sequence' or 'sampled_only'")
        if not 0.0 <= self.cache_hit_rate <= 1.0:
            raise user_error("tinker.cache_hit_rate", "must be in [0, 1]")


@dataclass(frozen=True)
class Scenario:
    """One row of the comparison.

    Attributes:
        workload, self_host: the run and where it is self-hosted.
        tinker: the uncached Tinker bill's setup.
        tinker_cached: the "w/ prefix caching" bill's setup, if the row has one.
        calibration: ``physical`` (first-principles defaults) or ``seed-calibrated`` (per-row
            values solved so the published table is hit; a regression test, not a claim).
        notes: provenance of the values, fitted ones named.
    """

    workload: Workload
    self_host: SelfHostSetup
    tinker: TinkerSetup
    tinker_cached: TinkerSetup | None = None
    calibration: Calibration = "physical"
    notes: tuple[str, ...] = ()


def override(obj: T, values: Mapping[str, Any], where: str) -> T:
    """A copy of the frozen dataclass ``obj`` with ``values`` replaced.

    Values are converted to the field's declared type (strings from the command line included)
    and checked against Literal choices.

    Raises:
        UserError: unknown field, or a value of the wrong type.
    """
    hints = typing.get_type_hints(type(obj))
    fields = {f.name for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - fields)
    if unknown:
        raise user_error(where, f"unknown keys {unknown}; known: {sorted(fields)}")
    converted = {k: coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()}
    return dataclasses.replace(obj, **converted)  # type: ignore[type-var]


def coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert ``value`` to the type ``hint`` (int, float, bool, str, Literal, Optional)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return coerce(value, args[0], where)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise user_error(where, f"expected one of {list(choices)}, got {value!r}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise user_error(where, f"expected true or false, got {value!r}")
    if hint in (int, float):
        try:
            number = hint(value)
        except (TypeError, ValueError):
            raise user_error(where, f"expected a number, got {value!r}") from None
        if hint is int and not isinstance(value, str) and number != value:
            raise user_error(where, f"expected an integer, got {value!r}")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise user_error(where, f"expected a string, got {value!r}")
        return value
    raise user_error(where, f"cannot set a field of type {hint}")
