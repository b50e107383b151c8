"""Builders for the Engine's training tests: datums, works, adapters with non-zero B."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence

import torch

from loraplex.domain.data import Datum, TensorData
from loraplex.domain.lora import LoraConfig
from loraplex.domain.work import ForwardBackwardWork
from loraplex.engine.executor import Engine


def ce_datum(gen: torch.Generator, n: int, vocab: int, *, signed_weights: bool = False,
             extra: Mapping[str, Sequence[float]] | None = None) -> Datum:
    """A random next-token datum; weights 1 (or fractional, some negative)."""
    tokens = torch.randint(0, vocab, (n + 1,), generator=gen).tolist()
    weights = (torch.randn(n, generator=gen) if signed_weights else torch.ones(n)).tolist()
    inputs = {"target_tokens": TensorData("int64", (n,), array("q", tokens[1:])),
              "weights": TensorData("float32", (n,), array("f", weights))}
    for key, values in (extra or {}).items():
        inputs[key] = TensorData("float32", (n,), array("f", values))
    return Datum(array("q", tokens[:-1]), inputs)


def rl_datum(gen: torch.Generator, n: int, vocab: int, logprob: float = -3.0) -> Datum:
    """A datum for the RL losses: advantages ±, sampling logprobs near ``logprob``, every
    position in GSPO's sequence ratio."""
    advantages = torch.randn(n, generator=gen).tolist()
    sampled = (logprob + 0.1 * torch.randn(n, generator=gen)).tolist()
    return ce_datum(gen, n, vocab, extra={"advantages": advantages, "logprobs": sampled,
                                          "sequence_ratio_mask": [1.0] * n})


def work(request_id: str, adapter_id: str, data: Sequence[Datum], loss_fn: str = "cross_entropy",
         forward_only: bool = False, **config: float) -> ForwardBackwardWork:
    return ForwardBackwardWork(request_id, adapter_id, tuple(data), loss_fn, dict(config),
                               forward_only)


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
