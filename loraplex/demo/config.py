"""Settings of one demo run, built once by the CLI from a named preset."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import tinker

TASKS = ("clamp", "arithmetic")
OPTIMIZERS = ("adamw", "dimuon")


#: Dimuon's learning rates on the tiny model (rank 32), from the sweep in
#: `benchmarks/dimuon_sft.py` (results: benchmarks/results/dimuon_sft.md).
DIMUON_SFT_LR = 1e-2
DIMUON_RL_LR = 1e-3


@dataclass(frozen=True)
class DemoConfig:
    """Hyper-parameters of a demo run.

    Attributes:
        model_source: what the server serves (``builtin:tiny``, ``builtin:smollm2-135m``, ...).
        base_model: catalogue name the server serves it under.
        task: ``clamp`` (write clamp(x, lo, hi), graded on fixtures) or ``arithmetic`` (the
            cookbook's two-number addition, reward 1 for the right integer).
        kv_cache_blocks: the server's sampler KV-cache pages (None: the engine default).
        server_threads: the server's torch threads when ``--threads`` is not given.
        rank: LoRA rank (attention, MLP and unembed all trained).
        seed: seeds prompts, the SFT shuffle, adapter init and sampling.
        num_prompts: prompt variants (clamp: phrasings × shown fixtures; arithmetic: the
            held-out evaluation problems).
        eval_base: measure the base model's pass rate (reward) before any training.
        sft_correct_fraction: share of correct solutions in the warm-start mix.
        sft_steps: SFT optimizer steps (0: no warm start); each is one pass over `sft_batch`.
        sft_batch: examples per SFT step.
        optimizer: ``adamw`` (Tinker's default) or ``dimuon``, for both phases.
        sft_learning_rate: AdamW learning rate during SFT.
        dimuon_sft_learning_rate: Dimuon learning rate during SFT (its direction has Frobenius
            norm √rank per matrix, so its scale is not AdamW's).
        rl_steps: GRPO steps.
        prompts_per_step: groups per GRPO step (clamp cycles through its prompts; arithmetic
            draws fresh problems each step).
        group_size: completions per prompt (G).
        rl_learning_rate: AdamW learning rate during GRPO.
        dimuon_rl_learning_rate: Dimuon learning rate during GRPO.
        temperature: sampling temperature for rollouts and evaluation.
        max_tokens: completion budget.
        max_operand: arithmetic operands are drawn from 0..max_operand.
        eval_samples_per_prompt: completions per prompt when measuring pass rates.
    """

    model_source: str = "builtin:tiny"
    base_model: str = "Qwen/Qwen3-8B"
    task: str = "clamp"
    kv_cache_blocks: int | None = None
    server_threads: int = 1
    rank: int = 32
    seed: int = 0
    num_prompts: int = 8
    eval_base: bool = False
    sft_correct_fraction: float = 0.5
    sft_steps: int = 200
    sft_batch: int = 16
    optimizer: Literal["adamw", "dimuon"] = "adamw"
    sft_learning_rate: float = 5e-3
    dimuon_sft_learning_rate: float = DIMUON_SFT_LR
    rl_steps: int = 70
    prompts_per_step: int = 8
    group_size: int = 8
    rl_learning_rate: float = 5e-4
    dimuon_rl_learning_rate: float = DIMUON_RL_LR
    temperature: float = 1.0
    max_tokens: int = 48
    max_operand: int = 100
    eval_samples_per_prompt: int = 32

    def optimizer_config(self) -> tinker.types.OptimizerConfig:
        import tinker  # here, not at import: the CLI sets HF_HOME before anything loads the hub

        if self.optimizer == "dimuon":
            return tinker.types.DimuonOptimizerConfig()
        return tinker.types.AdamOptimizerConfig()

    def optim_params(self, phase: Literal["sft", "rl"]) -> tinker.types.OptimParams:
        """One step's hyper-parameters for ``phase`` with the run's optimizer."""
        import tinker

        if self.optimizer == "dimuon":
            lr = self.dimuon_sft_learning_rate if phase == "sft" else self.dimuon_rl_learning_rate
            return tinker.types.DimuonParams(learning_rate=lr)
        lr = self.sft_learning_rate if phase == "sft" else self.rl_learning_rate
        return tinker.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)


SMOLLM2 = DemoConfig(
    model_source="builtin:smollm2-135m", base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    # 256 pages hold 128 sequences of ~150 tokens; the engine default (2048) would zero 6 GB of
    # KV cache for 30 layers.
    kv_cache_blocks=256, server_threads=2, rank=16, eval_base=True,
    # Sized for ~15 minutes on 2 cores (training ~60-110 tok/s, sampling ~40-130 tok/s there):
    # 12 SFT steps of 8 teach the answer format on a 3:1 mix of correct and buggy solutions
    # (one buggy per prompt), so GRPO starts from ~0.75 with one bug left to unlearn; 12 GRPO
    # steps of 4 prompts x G = 8. LoRA learning rates ~1e-3 suit a 576-wide model (the
    # cookbook's get_lr scaling gives 1.3e-3 for hidden 576).
    sft_correct_fraction=0.75, sft_steps=12, sft_batch=8, sft_learning_rate=1e-3,
    rl_steps=12, prompts_per_step=4, group_size=8, rl_learning_rate=1e-3,
    max_tokens=40, eval_samples_per_prompt=16,
)

PRESETS: dict[tuple[str, str], DemoConfig] = {
    ("tiny", "clamp"): DemoConfig(),
    ("smollm2", "clamp"): SMOLLM2,
    ("smollm2", "arithmetic"): replace(
        # The cookbook's operands (0..100) give the base model 1-5 % reward (probed at T = 1
        # and 0.7, 64 samples each) and 0 % greedy; 0..20 gives 16-19 %: room to rise.
        # 15 steps of 6 fresh problems x G = 8 (~40 s a step on 2 cores); evaluation on 32
        # held-out problems x 8 samples.
        SMOLLM2, task="arithmetic", sft_steps=0, num_prompts=32, rl_steps=15,
        prompts_per_step=6, group_size=8, rl_learning_rate=1e-3, max_tokens=16, max_operand=20,
        eval_samples_per_prompt=8),
}
MODELS = tuple(sorted({model for model, _ in PRESETS}))


def preset(model: str, task: str) -> DemoConfig:
    """The preset of (model, task); ValueError names the known combinations."""
    try:
        return PRESETS[(model, task)]
    except KeyError:
        known = ", ".join(f"--model {m} --task {t}" for m, t in PRESETS)
        raise ValueError(f"no demo preset for --model {model} --task {task}; "
                         f"known: {known}") from None
