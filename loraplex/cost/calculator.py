"""The per-token vs GPU-hour calculator: a scenario in, both bills and the winner out.

Tinker bills tokens (`tinker_usage` → `loraplex.cost.pricing.price_usage`); a self-hosted run
pays for every second of rented GPUs, busy or waiting on the environment (`self_hosted_cost`,
built from `flops`, `memory`, `timing` and `step`). Pure functions of frozen inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loraplex.cost.cards.hardware import HardwareCard, get_hardware_card
from loraplex.cost.cards.models import get_model_card
from loraplex.cost.flops import (
    TrainingMethod,
    adapter_flops_per_token_per_pass,
    forward_flops,
    policy_forward_flops,
    training_flops,
)
from loraplex.cost.memory import ReplicaLayout, plan_layout, require_training_fits
from loraplex.cost.price_sheets import get_price_sheet
from loraplex.cost.pricing import HOURS_PER_MONTH, Bill, TokenUsage, price_usage
from loraplex.cost.step import StepCost, StepPhases, step_cost
from loraplex.cost.timing import compute_seconds, decode_seconds
from loraplex.cost.workloads import Scenario, SelfHostSetup, TinkerSetup, Workload
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model_card import ModelCard

Winner = Literal["tinker", "self_hosted"]


@dataclass(frozen=True)
class TinkerResult:
    """A Tinker bill for a whole run."""

    setup: TinkerSetup
    model: str
    usage: TokenUsage
    bill: Bill

    @property
    def total_usd(self) -> float:
        return self.bill.total_usd


@dataclass(frozen=True)
class SelfHostedResult:
    """A self-hosted run: GPUs, time, and the bill split by what the GPU-seconds did."""

    hardware: HardwareCard
    layout: ReplicaLayout
    phases: StepPhases
    step: StepCost
    steps: int
    usd_per_gpu_hour: float

    def usd(self, gpu_seconds_per_step: float) -> float:
        return gpu_seconds_per_step * self.steps * self.usd_per_gpu_hour / 3600.0

    @property
    def breakdown_usd(self) -> dict[str, float]:
        s = self.step
        return {"prefill": self.usd(s.prefill_gpu_s),
                "decode_weights": self.usd(s.decode_weights_gpu_s),
                "decode_kv": self.usd(s.decode_kv_gpu_s), "train": self.usd(s.train_gpu_s),
                "env_idle": self.usd(s.env_idle_gpu_s), "fixed": self.usd(s.fixed_gpu_s)}

    @property
    def total_usd(self) -> float:
        return self.usd(self.step.wall_s * self.step.num_gpus)

    @property
    def wall_clock_s(self) -> float:
        return self.step.wall_s * self.steps


@dataclass(frozen=True)
class Comparison:
    """Both bills of one scenario; the winner and factor compare the uncached Tinker bill."""

    scenario: Scenario
    tinker: TinkerResult
    tinker_cached: TinkerResult | None
    self_hosted: SelfHostedResult

    @property
    def winner(self) -> Winner:
        return "tinker" if self.tinker.total_usd < self.self_hosted.total_usd else "self_hosted"

    @property
    def factor(self) -> float:
        """How many times cheaper the winner is (≥ 1)."""
        a, b = self.tinker.total_usd, self.self_hosted.total_usd
        return max(a, b) / min(a, b)


def tinker_rollout_usage(workload: Workload, setup: TinkerSetup) -> TokenUsage:
    """Billable tokens of one rollout (storage excluded).

    Every turn re-sends its whole history as a prompt (``P = Σ_t c_t``); the datum trained
    on is the whole trajectory (merged) or every turn's prompt + completion (per turn).
    """
    contexts = workload.contexts()
    d = workload.sample_tokens_per_turn
    prefill = sum(contexts)
    sampled = d * workload.turns
    if setup.train_token_basis == "sampled_only":
        trained = sampled
    elif workload.train_datums == "merged":
        trained = workload.final_length
    else:
        trained = sum(c + d for c in contexts)
    if setup.cache_hits == "hit_rate":
        hits = setup.cache_hit_rate * prefill
    elif setup.cache_hits == "new_tokens":
        never_seen = (workload.prompt_tokens / workload.group_size
                      + workload.observation_tokens_per_turn * (workload.turns - 1))
        hits = prefill - never_seen
    else:
        hits = 0.0
    return TokenUsage(prefill, hits, sampled, trained)


def tinker_cost(workload: Workload, setup: TinkerSetup, lora_rank: int) -> TinkerResult:
    """Tinker's bill for the whole run (one adapter checkpoint set stored as configured)."""
    sheet = get_price_sheet(setup.price_sheet)
    model = setup.tinker_model or workload.model
    per_rollout = tinker_rollout_usage(workload, setup)
    tokens = per_rollout.scaled(workload.rollouts_per_step * workload.steps)
    card = get_model_card(workload.model)
    adapter_gb = card.lora_params(lora_rank) * setup.checkpoint_bytes_per_param / 1e9
    gb_hours = setup.checkpoints_kept * adapter_gb * setup.storage_months * HOURS_PER_MONTH
    usage = tokens + TokenUsage(storage_gb_hours=gb_hours)
    bill = price_usage(usage, sheet, model, setup.billing_mode, setup.cached_prefill_ratio)
    return TinkerResult(setup, model, usage, bill)


def prefill_flops_per_rollout(card: ModelCard, workload: Workload, setup: SelfHostSetup,
                              method: TrainingMethod) -> float:
    """Prefill FLOPs one rollout causes on a prefix-caching server.

    Turn 1: the prompt, computed once per group when the group shares it. Turn t > 1: the
    new observation plus the evicted ``1 - h`` share of the history, as one chunk after the
    cached prefix.
    """
    adapter = adapter_flops_per_token_per_pass(card, method)
    p0 = workload.prompt_tokens
    share = workload.group_size if setup.share_group_prompt else 1
    total = (forward_flops(card, p0) + adapter * p0) / share
    o, h = workload.observation_tokens_per_turn, setup.prefix_cache_hit_rate
    for context in workload.contexts()[1:]:
        new = o + (1.0 - h) * (context - o)
        total += forward_flops(card, new, start=context - new) + adapter * new
    return total


def train_flops_per_rollout(card: ModelCard, workload: Workload, setup: SelfHostSetup,
                            method: TrainingMethod) -> float:
    """Trainer FLOPs of one rollout: forward_backward on its datums, plus the optional
    old-policy logprob recompute and reference-policy forward."""
    d = workload.sample_tokens_per_turn
    if workload.train_datums == "merged":
        datums: tuple[float, ...] = (workload.final_length,)
    else:
        datums = tuple(c + d for c in workload.contexts())
    total = 0.0
    for length in datums:
        total += training_flops(card, length, method)
        if setup.logprob_recompute:
            total += policy_forward_flops(card, length, method)
        if setup.reference_forward:
            total += forward_flops(card, length)
    return total


def self_hosted_cost(workload: Workload, setup: SelfHostSetup) -> SelfHostedResult:
    """Rent GPUs, run every phase of every step, and pay for the wall clock.

    Raises:
        UserError: the model or its KV cache does not fit the GPUs, or bad setup values.
    """
    card = get_model_card(workload.model)
    hardware = get_hardware_card(setup.hardware)
    bpp = setup.weight_bytes_per_param or card.weight_bytes_per_param
    layout = plan_layout(card, hardware, weight_bytes_per_param=bpp, num_gpus=setup.num_gpus,
                         tensor_parallel=setup.tensor_parallel,
                         memory_fraction=setup.memory_fraction, kv_reserve=setup.kv_reserve)
    method = TrainingMethod(kind=setup.training, lora=LoraConfig(rank=setup.lora_rank),
                            activation_checkpointing=setup.activation_checkpointing)
    disaggregated = setup.mode == "disaggregated"
    trainer_gpus = setup.trainer_gpus if disaggregated and setup.trainer_gpus else layout.num_gpus
    trainer_layout = layout if not disaggregated else ReplicaLayout(
        trainer_gpus, 1, trainer_gpus, card.weight_bytes(bpp), 0.0)
    require_training_fits(card, method, trainer_layout, hardware, setup.memory_fraction)
    rollouts = workload.rollouts_per_step
    prefill = prefill_flops_per_rollout(card, workload, setup, method) * rollouts
    decode_w = decode_kv = 0.0
    for context in workload.contexts():
        t = decode_seconds(card, layout, hardware, rollouts=rollouts, context=context,
                           new_tokens=workload.sample_tokens_per_turn,
                           weight_bytes_per_param=bpp, mbu=setup.decode_mbu)
        decode_w, decode_kv = decode_w + t.weights_s, decode_kv + t.kv_s
    train = train_flops_per_rollout(card, workload, setup, method) * rollouts
    phases = StepPhases(
        prefill_s=compute_seconds(prefill, hardware, layout.num_gpus, setup.prefill_mfu),
        decode_weights_s=decode_w, decode_kv_s=decode_kv,
        train_s=compute_seconds(train, hardware, trainer_gpus, setup.train_mfu),
        env_s=workload.env_seconds_per_turn * workload.turns,
        fixed_s=setup.fixed_seconds_per_step,
        rollout_gpus=layout.num_gpus, trainer_gpus=trainer_gpus)
    price = hardware.usd_per_hour if setup.usd_per_gpu_hour is None else setup.usd_per_gpu_hour
    return SelfHostedResult(hardware, layout, phases,
                            step_cost(phases, setup.mode, setup.async_steps), workload.steps,
                            price)


def compare(scenario: Scenario) -> Comparison:
    """Both bills of ``scenario`` (and the prefix-caching Tinker bill, if it has one)."""
    w, rank = scenario.workload, scenario.self_host.lora_rank
    cached = (tinker_cost(w, scenario.tinker_cached, rank)
              if scenario.tinker_cached is not None else None)
    return Comparison(scenario, tinker_cost(w, scenario.tinker, rank), cached,
                      self_hosted_cost(w, scenario.self_host))
