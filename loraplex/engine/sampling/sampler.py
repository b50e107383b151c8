"""`Sampler`: continuous batching of sample requests over a paged KV cache with prefix sharing.

Admits `SampleWork`, prefills only the prompt tokens not covered by cached blocks, then runs
decode steps in which one forward batches every running sequence of every adapter (and of the
bare base model). Knows nothing about HTTP, tenants, sequence ids or stability records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from loraplex.config import EngineConfig
from loraplex.domain.sampling import SampleResult
from loraplex.domain.work import SampleWork
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.transformer import Transformer
from loraplex.errors import LoraplexError


class Sampler:
    """The engine's sampling half: running requests, their KV blocks, the prefix cache."""

    def __init__(self, model: Transformer, bank: AdapterBank, config: EngineConfig,
                 model_dir: str, ensure_adapter: Callable[[str, str | None], None]) -> None:
        """Args:
            model: the frozen base model (its compute options decide invariant vs fast mode).
            bank: resident adapters; sampled rows read their LoRA from here.
            config: the engine slice (kv_block_size, kv_cache_blocks, max_context).
            model_dir: the model directory; ``tokenizer.json`` there detokenizes stop strings.
            ensure_adapter: ``(adapter_id, adapter_dir)`` makes the adapter resident (loading
                it from ``adapter_dir`` if needed) or raises a `LoraplexError` that fails that
                request alone.
        """
        raise NotImplementedError

    def step(self, admit: Sequence[SampleWork], max_decode_steps: int
             ) -> list[tuple[str, SampleResult | LoraplexError]]:
        """Admit ``admit`` (validate, prefill), run up to ``max_decode_steps`` decode steps for
        every running sequence, and return finished requests ``(request_id, outcome)``.

        A request whose validation or adapter load fails is returned at once with its error;
        requests that do not finish keep running on the next call.
        """
        raise NotImplementedError

    def num_running(self) -> int:
        """Requests admitted (or waiting for KV blocks) and not yet returned."""
        raise NotImplementedError

    def invalidate_adapter(self, adapter_id: str) -> None:
        """Forget cached prefix blocks of ``adapter_id``: the engine calls this when the
        adapter is deleted or its weights change (optim_step on a live id, load)."""
        raise NotImplementedError
