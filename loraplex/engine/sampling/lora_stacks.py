"""`AdapterVersions` (prefix-cache identity of adapter weights) and `LoraStacks` (stacked LoRA
tensors reused across decode steps).

An adapter id alone does not identify weights: a live training adapter changes in place at
every optim_step, and a deleted id can come back with other weights. `AdapterVersions` keys each
adapter by id + a version that `bump` (called by the engine on weight changes) or a replaced
`LoraAdapter` object (detected by weak reference) advances. `LoraStacks` keeps the stacks of
the last few adapter-version tuples, so a decode step whose adapters did not change re-stacks
nothing; only the cheap segment offsets follow the rows.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import PackedBatch

BASE_KEY = "base"
#: Distinct adapter tuples whose stacks are kept (decode batch, prefill batch, head batch...).
MAX_STACKS = 4


class AdapterVersions:
    """``adapter id → version`` for prefix-cache keys."""

    def __init__(self, bank: AdapterBank) -> None:
        self._bank = bank
        self._versions: dict[str, int] = {}
        self._seen: dict[str, weakref.ref[LoraAdapter]] = {}

    def key(self, adapter_id: str | None) -> str:
        """The prefix-cache key of the current weights (``base`` for the bare model).

        Raises:
            NotFoundError: the adapter is not in the bank.
        """
        if adapter_id is None:
            return BASE_KEY
        return f"lora:{self.version(adapter_id)}:{adapter_id}"

    def version(self, adapter_id: str) -> int:
        """The current version of a resident adapter.

        Raises:
            NotFoundError: the adapter is not in the bank.
        """
        adapter = self._bank.get(adapter_id)
        seen = self._seen.get(adapter_id)
        if seen is None or seen() is not adapter:
            if seen is not None:
                self.bump(adapter_id)
            self._seen[adapter_id] = weakref.ref(adapter)
        return self._versions.get(adapter_id, 0)

    def bump(self, adapter_id: str) -> None:
        """The adapter's weights changed or it was deleted: later keys differ."""
        self._versions[adapter_id] = self._versions.get(adapter_id, 0) + 1


class LoraStacks:
    """`AdapterBank.stack` reusing the stacked targets of the last few adapter-version tuples
    (``reuse=``), so a decode step whose adapters did not change re-stacks nothing."""

    def __init__(self, bank: AdapterBank, versions: AdapterVersions, rank_multiple: int,
                 dtype: torch.dtype) -> None:
        self._bank = bank
        self._versions = versions
        self._rank_multiple = rank_multiple
        self._dtype = dtype
        self._stacks: OrderedDict[tuple[tuple[str, int], ...], LoraBatch] = OrderedDict()

    def for_batch(self, batch: PackedBatch) -> LoraBatch | None:
        """The `LoraBatch` of ``batch`` (None: base rows only).

        Raises:
            NotFoundError: an adapter of the batch is not resident.
        """
        rows = batch.lora_rows
        if rows is None:
            return None
        key = tuple((a, self._versions.version(a)) for a in rows.adapter_ids)
        lora = self._bank.stack(batch, rank_multiple=self._rank_multiple, dtype=self._dtype,
                                reuse=self._stacks.get(key))
        assert lora is not None
        self._stacks[key] = lora
        self._stacks.move_to_end(key)
        while len(self._stacks) > MAX_STACKS:
            self._stacks.popitem(last=False)
        return lora

    def drop(self, adapter_id: str) -> None:
        """Forget stacks holding this adapter (its weights changed or it is gone)."""
        for key in [k for k in self._stacks if any(a == adapter_id for a, _ in k)]:
            del self._stacks[key]
