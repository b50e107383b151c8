"""`AdapterBank`: every LoRA adapter of one base model, by adapter id (resident, or paged out by
`engine.paging.AdapterPager`, which leaves the same object here with placeholder leaves).

Deliberate deviation from STYLE §3.8's "stacked bank (slot × rank × dim)": adapters are stored
individually at their exact rank, and only the adapters present in a batch are stacked, per
batch, into a `LoraBatch`. Reasons:
* memory is exact: an adapter costs its own parameters (+ gradients while training, + two Adam
  moments held by the optimizer), not ``max_loras × max_rank`` pre-allocated slots;
* heterogeneous ranks need no per-slot bookkeeping: the per-batch stack zero-pads to the
  batch's rank, and zero rows/columns contribute exact zeros;
* create/delete touch a dict, never the base model or other adapters' tensors, and gradients
  land in each adapter's own leaves (``torch.stack`` is differentiable).
The price is one ``stack`` per target per forward (small next to the GEMMs it feeds).
"""

from __future__ import annotations

import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.stacking import stack_adapters
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import PackedBatch
from loraplex.engine.model.spec import ModelSpec
from loraplex.errors import ConflictError, NotFoundError


class AdapterBank:
    """Adapter id → `LoraAdapter`, all on one device beside one base model."""

    def __init__(self, spec: ModelSpec, device: torch.device | str, max_rank: int) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.max_rank = max_rank
        self._adapters: dict[str, LoraAdapter] = {}

    def create(self, adapter_id: str, config: LoraConfig) -> LoraAdapter:
        """Add a fresh adapter (B = 0, so it computes exactly the base model).

        Raises:
            UserError: invalid config (rank above the maximum, nothing trained).
            ConflictError: the id is taken.
        """
        config.validate(self.max_rank)
        adapter = LoraAdapter.create(self.spec, config, self.device)
        self.put(adapter_id, adapter)
        return adapter

    def put(self, adapter_id: str, adapter: LoraAdapter) -> None:
        """Register a ready adapter (loaded checkpoint, frozen sampler copy)."""
        if adapter_id in self._adapters:
            raise ConflictError(f"adapter {adapter_id!r} already exists", field="adapter_id")
        self._adapters[adapter_id] = adapter

    def delete(self, adapter_id: str) -> None:
        """Drop an adapter; unknown ids are ignored."""
        self._adapters.pop(adapter_id, None)

    def get(self, adapter_id: str) -> LoraAdapter:
        adapter = self._adapters.get(adapter_id)
        if adapter is None:
            raise NotFoundError(f"adapter {adapter_id!r} not found", field="adapter_id")
        return adapter

    def __contains__(self, adapter_id: object) -> bool:
        return adapter_id in self._adapters

    def __len__(self) -> int:
        return len(self._adapters)

    def ids(self) -> list[str]:
        return list(self._adapters)

    def snapshot(self, src_id: str, dst_id: str) -> LoraAdapter:
        """Freeze ``src``'s current weights under ``dst`` (a sampler version)."""
        copy = self.get(src_id).frozen_copy()
        self.put(dst_id, copy)
        return copy

    def nbytes(self) -> int:
        return sum(a.nbytes() for a in self._adapters.values())

    def stack(self, batch: PackedBatch, *, rank_multiple: int, dtype: torch.dtype,
              reuse: LoraBatch | None = None) -> LoraBatch | None:
        """The `LoraBatch` for ``batch``'s adapter segments; None when all rows are base rows.

        ``reuse``: the previous step's `LoraBatch` when the same (unchanged) adapters decode
        again; its stacked weights are reused (`stack_adapters`).

        Raises:
            NotFoundError: a segment names an adapter that is not resident.
        """
        if batch.lora_rows is None:
            return None
        adapters = [self.get(a) for a in batch.lora_rows.adapter_ids]
        return stack_adapters(self.spec, adapters, batch.lora_rows,
                              rank_multiple=rank_multiple, dtype=dtype, reuse=reuse,
                              device=self.device)
