"""The benchmarks' LoRA adapter: B ≠ 0, so it changes every logit (a fresh adapter's B is 0 and
would make the LoRA path a no-op the benchmark still paid for)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loraplex.engine.lora.adapter import LoraAdapter
    from loraplex.engine.lora.bank import AdapterBank


def nonzero_adapter(bank: AdapterBank, rank: int, alpha: int, adapter_id: str = "policy",
                    scale: float = 0.02, seed: int = 1) -> LoraAdapter:
    """Create ``adapter_id`` in ``bank`` with every B drawn from N(0, scale²).

    loraplex is imported here, not at module level: `step_overhead`'s child process puts the
    revision it measures on ``sys.path`` first.
    """
    import torch

    from loraplex.domain.lora import LoraConfig

    adapter = bank.create(adapter_id, LoraConfig(rank=rank, alpha=alpha, seed=0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in adapter.weights.values():
            w.b_L_O_Rk.copy_(torch.randn(w.b_L_O_Rk.shape, generator=gen) * scale)
    return adapter
