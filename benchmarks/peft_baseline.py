"""transformers + PEFT, the baseline `engine_moe` and `engine_families` run against: the
checkpoint's own transformers class with a PEFT LoRA (B ≠ 0 for sampling, as ours), its
training step, and rounds of sampling interleaved with ours; plus the rounds and the adapter
bytes both benchmarks measure the same way.

One process, the same base weights on both sides; ours comes from `engine_train` and
`engine_sample` (their steps, workloads and timings).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.adapters import nonzero_adapter
from benchmarks.engine_sample import FANOUT, Engines, Timing, Workload, prompts, run_hf, run_ours
from benchmarks.engine_sample import summary as sample_summary
from benchmarks.engine_train import ADAM, LORA, RANK, Step
from loraplex.config import EngineConfig
from loraplex.engine.executor import Engine


def hf_model(model_dir: str) -> Any:
    """transformers' own class for the checkpoint (a multimodal Qwen3.5 one: its
    ``…ForConditionalGeneration``, run on text), fp32, its experts by their eager loop."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_dir)
    auto = (AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None
            else AutoModelForCausalLM)
    return auto.from_pretrained(model_dir, dtype=torch.float32)


def peft_model(model_dir: str, modules: list[str], parameters: list[str], train: bool,
               exclude: str | None = None, seed: int = 1) -> Any:
    """`hf_model` + PEFT LoRA on ``modules`` and the fused 3-D ``parameters`` (PEFT's MoE
    support: a LoRA per expert); for sampling, every B random (≠ 0) so the adapter changes
    every logit as ours does."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    model = get_peft_model(hf_model(model_dir), PeftLoraConfig(
        r=RANK, lora_alpha=LORA.alpha, lora_dropout=0.0, target_modules=modules,
        target_parameters=parameters or None, exclude_modules=exclude))
    if not train:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.train() if train else model.eval()


def train_step(model: Any, sequences: list[list[int]]) -> tuple[Step, int]:
    """One forward_backward + ``torch.optim.AdamW`` step of ``model`` (a training
    `peft_model`) on the sequences right-padded with a mask; also its trainable count."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=ADAM.learning_rate,
                                  betas=(ADAM.beta1, ADAM.beta2), eps=ADAM.eps, weight_decay=0.0)
    width = max(len(s) for s in sequences)
    input_ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, s in enumerate(sequences):
        input_ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    labels = input_ids.masked_fill(mask == 0, -100)

    def step() -> None:
        model(input_ids=input_ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in trainable)


def train_rounds(steps: dict[str, Step], rounds: int, desc: str
                 ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process CPU seconds of every step, each once per round in order; round 0 is a
    warm-up, untimed."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for r in tqdm(range(rounds + 1), desc=desc):
        for name, step in steps.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            if r:
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    return times, cpu


def adapter_bytes(engine: Engine, adapter_id: str) -> tuple[int, int]:
    """(resident bytes of the adapter and its AdamW state, 12 B × the card's Tinker-scheme
    parameter count: fp32 parameters and two moments)."""
    adapter = engine.bank.get(adapter_id)
    state = engine.trainer.optimizer_state(adapter_id)
    measured = adapter.nbytes() + (state.nbytes if state is not None else 0)
    return measured, 12 * engine.model_info().card.lora_params(RANK)


def sample_rounds(model_dir: Path, peft: Any, rounds: int, desc: str) -> dict[str, Any]:
    """Ours (the KV-cache sampler, a B ≠ 0 adapter) and HF ``generate`` on ``peft``, the
    `engine_sample` fan-out workload, interleaved round by round after one warm-up each."""
    from loraplex.engine.lora.bank import AdapterBank
    from loraplex.engine.model.loader import load_model

    model = load_model(model_dir, EngineConfig(batch_invariant=True))
    bank = AdapterBank(model.spec, "cpu", max_rank=RANK)
    nonzero_adapter(bank, RANK, LORA.alpha)
    engines = Engines(model_dir, model, model, bank, peft)
    vocab = model.spec.vocab_size
    warm = Workload("warm", 8, 128, 8, 4)
    run_ours(engines, model, warm, prompts(warm, 0, vocab))
    run_hf(engines, warm, prompts(warm, 0, vocab))
    runs: dict[str, list[Timing]] = {"ours": [], "hf_generate": []}
    for r in tqdm(range(rounds), desc=desc):
        batch = prompts(FANOUT, 1000 + r, vocab)
        runs["ours"].append(run_ours(engines, model, FANOUT, batch)[0])
        runs["hf_generate"].append(run_hf(engines, FANOUT, batch))
    return {name: sample_summary(FANOUT, timings) for name, timings in runs.items()}


def paired(slower_s: list[float], faster_s: list[float]) -> float:
    """Median over rounds of ``slower / faster`` seconds (the same work on both sides)."""
    return statistics.median(a / b for a, b in zip(slower_s, faster_s, strict=True))
