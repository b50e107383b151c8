"""Builders for the Engine's training tests: datums, works, adapters with non-zero B.

`ce_datum` and `work` are the benchmarks' builders too (`benchmarks/harness/works.py`)."""

from __future__ import annotations

import torch

from benchmarks.harness.works import ce_datum
from benchmarks.harness.works import train_work as work
from loraplex.domain.data import Datum
from loraplex.domain.lora import LoraConfig
from loraplex.engine.executor import Engine

__all__ = ["ce_datum", "create_random_adapter", "grads", "rel_err", "rl_datum", "work"]


def rl_datum(gen: torch.Generator, n: int, vocab: int, logprob: float = -3.0) -> Datum:
    """A datum for the RL losses: advantages ±, sampling logprobs near ``logprob``, every
    position in GSPO's sequence ratio."""
    advantages = torch.randn(n, generator=gen).tolist()
    sampled = (logprob + 0.1 * torch.randn(n, generator=gen)).tolist()
    return ce_datum(gen, n, vocab, extra={"advantages": advantages, "logprobs": sampled,
                                          "sequence_ratio_mask": [1.0] * n})


def create_random_adapter(engine: Engine, adapter_id: str, config: LoraConfig, seed: int
                          ) -> None:
    """Create an adapter and give it random A and B (B ≠ 0 exercises every gradient path)."""
    engine.create_adapter(adapter_id, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in engine.bank.get(adapter_id).parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def grads(engine: Engine, adapter_id: str) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone()
            for p in engine.bank.get(adapter_id).parameters()]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()
