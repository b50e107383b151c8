"""The cost model's prediction for what `benchmarks/cost_validation/` ran and measured.

Owns the run's shape (`Settings`), what the server reported per step (`Snapshot`, `Measured`,
`StepRecord`) and the comparison: a `ModelCard` from the served config.json and, per step, a
`HardwareCard.custom` from the GEMM rate and copy bandwidth probed just before and after that
step (achieved rates, used at MFU = MBU = 1); per phase, the predicted FLOPs and seconds
summed over its steps against the measured engine seconds. Knows nothing about servers or SDKs.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.probe import MachineProbe
from loraplex.cost.cards.hardware import HardwareCard
from loraplex.cost.flops import TrainingMethod, forward_flops, training_flops
from loraplex.cost.memory import plan_layout
from loraplex.cost.timing import bandwidth_seconds, compute_seconds, decode_seconds
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model_card import ModelCard
from loraplex.engine.model.spec import ModelSpec

ADAMW_BYTES_PER_PARAM = 28.0
"""fp32 AdamW reads weight, gradient and both moments (16 B) and writes weight and moments
(12 B) for every trained parameter."""
KV_BYTES_PER_VALUE = 4.0
"""The CPU engine caches K and V in fp32; `decode_seconds` prices a bf16 cache (2 B)."""
WEIGHT_BYTES_PER_PARAM = 4.0
"""The CPU engine computes and stores weights in fp32."""
PHASES = ("sft_train", "rl_sample", "rl_train")
CALIBRATION = "rl_sample_calibration"
"""Sampling steps of other shapes, run before the rounds, that the per-iteration decode overhead
is fitted on (never part of a phase's ratio)."""


@dataclass(frozen=True)
class Settings:
    """Shape of the run: ``rounds`` × (one SFT step, one GRPO step), interleaved so both runs
    see the same machine.

    Attributes:
        threads: torch threads of the server and of the probes.
        rank: LoRA rank of both training runs.
        sft_lengths: input lengths of the fixed SFT batch (one forward_backward per step).
        rl_prompts, group_size: GRPO groups per step and completions per prompt.
        prompt_len, max_tokens: GRPO prompt length and completion budget.
        calibration_shapes: ``(prompts, G)`` of the sampling steps the per-iteration decode
            overhead is fitted on; other decode batches than the GRPO step's, so predicting
            that step from them is an extrapolation, not a fit.
    """

    threads: int
    rounds: int = 4
    rank: int = 16
    sft_lengths: tuple[int, ...] = (256,) * 8
    rl_prompts: int = 4
    group_size: int = 8
    prompt_len: int = 64
    max_tokens: int = 64
    learning_rate: float = 1e-4
    seed: int = 0
    calibration_shapes: tuple[tuple[int, int], ...] = ((1, 4), (2, 8))

    @classmethod
    def quick(cls, threads: int) -> Settings:
        return cls(threads, rounds=1, sft_lengths=(128,) * 4, rl_prompts=2, group_size=4,
                   prompt_len=32, max_tokens=16, calibration_shapes=((1, 2), (1, 4)))


@dataclass(frozen=True)
class Snapshot:
    """Server counters at one moment (all cumulative since the server started)."""

    engine_s: dict[str, float]
    train_s: float
    optim_s: float
    tokens: dict[str, int]


@dataclass
class Measured:
    """Engine seconds and tokens of one step (differences of two snapshots)."""

    engine_s: float = 0.0
    fwd_bwd_s: float = 0.0
    optim_s: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)

    def add(self, before: Snapshot, after: Snapshot, kind: str) -> None:
        """Add what the server did between two snapshots (``kind``: the plan kind timed)."""
        self.engine_s += after.engine_s.get(kind, 0.0) - before.engine_s.get(kind, 0.0)
        self.fwd_bwd_s += after.train_s - before.train_s
        self.optim_s += after.optim_s - before.optim_s
        for key, value in after.tokens.items():
            self.tokens[key] = self.tokens.get(key, 0) + value - before.tokens.get(key, 0)


@dataclass(frozen=True)
class StepRecord:
    """One measured step.

    Attributes:
        phase: one of `PHASES`.
        measured: what the server reported for it.
        probes: machine probes just before and just after it.
        datum_lengths: input lengths of a training step's datums.
        decode_matmul_s: a sampling step's base-model matmuls of one decode iteration alone,
            at its batch (`decode_matmul_seconds`), probed right after it.
        prompts, group_size: a sampling step's shape when it is not the settings' GRPO step
            (calibration steps); 0: the settings'.
    """

    phase: str
    measured: Measured
    probes: tuple[MachineProbe, MachineProbe]
    datum_lengths: tuple[int, ...] = ()
    decode_matmul_s: float = 0.0
    prompts: int = 0
    group_size: int = 0


def model_card(config_path: Path, name: str) -> ModelCard:
    """The cost model's card for the model the server loaded: the card the engine describes it
    with (`ModelInfo.card`, from its config.json), at this run's weight precision."""
    card = ModelSpec.from_dir(config_path.parent).model_info().card
    return dataclasses.replace(card, name=f"builtin {name}", source=str(config_path),
                               weight_bytes_per_param=WEIGHT_BYTES_PER_PARAM)


def hardware_card(probes: tuple[MachineProbe, ...], training: bool) -> HardwareCard:
    """This machine as the cost model sees it around one step: the mean probed fp32 matmul rate
    and copy bandwidth are its "peaks" (achieved rates, so used at MFU = MBU = 1). The matmul
    rate is of the kind the phase runs: LoRA training on a frozen base does forward and
    input-gradient GEMMs (the fwd+bwd, frozen-W probe); sampling does forward GEMMs."""
    rate = [p.gemm_fwd_bwd_gflops if training else p.gemm_gflops for p in probes]
    bandwidth = statistics.fmean(p.copy_gbps for p in probes) * 1e9
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return HardwareCard.custom("this-cpu", peak_flops=statistics.fmean(rate) * 1e9,
                               hbm_bandwidth=bandwidth, hbm_bytes=memory)


def train_step(card: ModelCard, method: TrainingMethod, rec: StepRecord) -> dict[str, float]:
    """forward_backward FLOPs at the fwd+bwd GEMM rate plus AdamW bytes at the copy rate."""
    hw = hardware_card(rec.probes, training=True)
    flops = sum(training_flops(card, n, method) for n in rec.datum_lengths)
    adam_bytes = ADAMW_BYTES_PER_PARAM * card.lora_params(method.lora.rank)
    m = rec.measured
    fwd_bwd_s = compute_seconds(flops, hw, 1, 1.0)
    optim_s = bandwidth_seconds(adam_bytes, hw, 1, 1.0)
    return {"predicted_s": fwd_bwd_s + optim_s, "measured_s": m.engine_s,
            "predicted_flops": flops,
            "fwd_bwd_predicted_s": fwd_bwd_s, "fwd_bwd_measured_s": m.fwd_bwd_s,
            "optim_predicted_s": optim_s, "optim_measured_s": m.optim_s,
            "tokens": m.tokens.get("trained_tokens", 0),
            "expected_tokens": sum(rec.datum_lengths)}


def sample_step(card: ModelCard, s: Settings, rec: StepRecord) -> dict[str, float]:
    """Prefill is compute-bound. Decode takes the longer of streaming the weights and every
    sequence's KV once per iteration (`decode_seconds`, the calculator's model) and its FLOPs
    at the GEMM rate (a roofline: at batch G·P on this CPU the FLOPs are the larger)."""
    hw, m = hardware_card(rec.probes, training=False), rec.measured
    prompts, group_size = rec.prompts or s.rl_prompts, rec.group_size or s.group_size
    rollouts = prompts * group_size
    # The G samples of a request share one prefill; the engine reports what it computed.
    computed = m.tokens.get("prompt_tokens", 0) - m.tokens.get("cache_hit_tokens", 0)
    prefill_flops = prompts * forward_flops(card, computed / prompts)
    new = m.tokens.get("sampled_tokens", 0) / rollouts
    layout = plan_layout(card, hw, weight_bytes_per_param=WEIGHT_BYTES_PER_PARAM, num_gpus=1,
                         tensor_parallel=1)
    dec = decode_seconds(card, layout, hw, rollouts=rollouts, context=s.prompt_len,
                         new_tokens=new, weight_bytes_per_param=WEIGHT_BYTES_PER_PARAM,
                         mbu=1.0)
    kv_s = dec.kv_s * KV_BYTES_PER_VALUE / 2.0
    decode_flops = rollouts * forward_flops(card, new, start=s.prompt_len)
    prefill_s = compute_seconds(prefill_flops, hw, 1, 1.0)
    compute_s = compute_seconds(decode_flops, hw, 1, 1.0)
    return {"predicted_s": prefill_s + max(dec.weights_s + kv_s, compute_s),
            "measured_s": m.engine_s, "predicted_flops": prefill_flops + decode_flops,
            "prefill_flops": prefill_flops, "prefill_s": prefill_s,
            "decode_flops": decode_flops, "decode_weights_s": dec.weights_s, "decode_kv_s": kv_s,
            "decode_compute_s": compute_s, "iterations": new, "rows": rollouts,
            "bandwidth_only_s": prefill_s + dec.weights_s + kv_s,
            "decode_matmul_probe_s": new * rec.decode_matmul_s,
            **{k: m.tokens.get(k, 0) for k in ("prompt_tokens", "cache_hit_tokens",
                                               "rollout_prompt_tokens", "sampled_tokens",
                                               "num_sequences")}}


def phase_row(steps: list[dict[str, float]], goal: float) -> dict[str, Any]:
    """Sums over a phase's steps, its raw ratio, and the per-step ratios (their spread is the
    noise of this machine)."""
    total: Counter[str] = Counter()
    for step in steps:
        total.update(step)
    ratio = total["measured_s"] / total["predicted_s"]
    out: dict[str, Any] = dict(total)
    out.update(ratio=ratio, within_goal=abs(ratio - 1.0) <= goal, num_steps=len(steps),
               step_ratios=[st["measured_s"] / st["predicted_s"] for st in steps])
    if "fwd_bwd_measured_s" in total:
        out["efficiency_vs_probe"] = total["fwd_bwd_predicted_s"] / total["fwd_bwd_measured_s"]
        out["achieved_gflops"] = total["predicted_flops"] / total["fwd_bwd_measured_s"] / 1e9
    else:
        out["bandwidth_only_ratio"] = total["measured_s"] / total["bandwidth_only_s"]
        out["decode_bound"] = ("compute" if total["decode_compute_s"]
                               > total["decode_weights_s"] + total["decode_kv_s"] else "bandwidth")
    return out


def fit_decode_overhead(steps: list[dict[str, float]]) -> dict[str, Any]:
    """Per decode iteration, what a sampling step took beyond its roofline prediction, as
    ``c0 + c1 · rows`` (least squares over the steps; one step or one batch size: ``c1 = 0``).
    Dispatch, sampling and per-layer work cost about the same per iteration whatever the batch
    (``c0``); LoRA gathers, attention tiles and the vocabulary pass grow with the rows (``c1``).
    """
    points = [(st["rows"], (st["measured_s"] - st["predicted_s"]) / st["iterations"])
              for st in steps if st["iterations"] > 0]
    if not points:
        return {"c0_s": 0.0, "c1_s_per_row": 0.0, "points": []}
    xs, ys = [x for x, _ in points], [y for _, y in points]
    x_mean, y_mean = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - x_mean) ** 2 for x in xs)
    c1 = sum((x - x_mean) * (y - y_mean) for x, y in points) / var if var else 0.0
    return {"c0_s": y_mean - c1 * x_mean, "c1_s_per_row": c1,
            "points": [{"rows": x, "overhead_s_per_iteration": y} for x, y in points]}


def calibrated(sft: dict[str, Any], rl_train: dict[str, Any], samples: list[dict[str, float]],
               measured_sample_s: float, calibration: list[dict[str, float]] | None = None
               ) -> dict[str, Any]:
    """Labelled calibrated, never the headline: SFT's forward_backward efficiency (achieved ÷
    probed GEMM rate) applied to GRPO's FLOP terms; sampling with each decode iteration priced
    at its base matmuls' time measured alone at that batch; and sampling as the roofline plus
    a per-iteration overhead fitted on the calibration steps (other decode batches)."""
    eff = sft["efficiency_vs_probe"]
    fit = fit_decode_overhead(calibration or [])
    fitted_s = sum(st["predicted_s"] + st["iterations"] * (fit["c0_s"]
                                                           + fit["c1_s_per_row"] * st["rows"])
                   for st in samples)
    train_s = rl_train["fwd_bwd_predicted_s"] / eff + rl_train["optim_predicted_s"]
    sample_s = sum(st["prefill_s"] / eff + max(st["decode_weights_s"] + st["decode_kv_s"],
                                               st["decode_compute_s"] / eff) for st in samples)
    probed_s = sum(st["prefill_s"] / eff + st["decode_matmul_probe_s"] for st in samples)
    return {
        "efficiency_from_sft": eff,
        "rl_train": {"predicted_s": train_s, "ratio": rl_train["measured_s"] / train_s},
        "rl_sample": {"predicted_s": sample_s, "ratio": measured_sample_s / sample_s},
        "rl_sample_decode_matmul_probe": {"predicted_s": probed_s,
                                          "ratio": measured_sample_s / probed_s},
        "decode_overhead_fit": fit,
        "rl_sample_overhead_fitted": {"predicted_s": fitted_s,
                                      "ratio": measured_sample_s / fitted_s if fitted_s else None}}


def probe_summary(probes: list[MachineProbe]) -> dict[str, Any]:
    return {"gemm_gflops_mean": statistics.fmean(p.gemm_gflops for p in probes),
            "gemm_fwd_bwd_gflops_mean": statistics.fmean(p.gemm_fwd_bwd_gflops for p in probes),
            "gemm_gflops_min": min(p.gemm_gflops for p in probes),
            "gemm_gflops_max": max(p.gemm_gflops for p in probes),
            "copy_gbps_mean": statistics.fmean(p.copy_gbps for p in probes),
            "load_avg_1m_mean": statistics.fmean(p.load_avg_1m for p in probes),
            "load_avg_1m_max": max(p.load_avg_1m for p in probes),
            "readings": [p.as_dict() for p in probes]}


def predict_phases(card: ModelCard, records: list[StepRecord], s: Settings, goal: float
                   ) -> dict[str, Any]:
    """The result document: per phase predicted vs measured, probes, calibration."""
    method = TrainingMethod(kind="lora", lora=LoraConfig(rank=s.rank))
    steps: dict[str, list[dict[str, float]]] = {p: [] for p in PHASES}
    calibration = [sample_step(card, s, rec) for rec in records if rec.phase == CALIBRATION]
    for rec in records:
        if rec.phase != CALIBRATION:
            steps[rec.phase].append(sample_step(card, s, rec) if rec.phase == "rl_sample"
                                    else train_step(card, method, rec))
    phases = {p: phase_row(steps[p], goal) for p in PHASES}
    probes = [records[0].probes[0]] + [r.probes[1] for r in records]
    return {
        "goal": goal, "ratio_definition": "measured_s / predicted_s",
        "model": {"name": card.name, "matmul_params": card.matmul_params,
                  "total_params": card.total_params,
                  "lora_params": int(card.lora_params(s.rank)), "rank": s.rank},
        "hardware_card_example": {"training": asdict(hardware_card(records[0].probes, True)),
                                  "sampling": asdict(hardware_card(records[0].probes, False))},
        "probes": probe_summary(probes),
        "phases": phases,
        "calibrated": calibrated(phases["sft_train"], phases["rl_train"], steps["rl_sample"],
                                 phases["rl_sample"]["measured_s"], calibration),
        "calibration_steps": calibration,
    }
