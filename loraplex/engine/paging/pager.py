"""`AdapterPager`: keeps resident adapter state within `EngineConfig.adapter_memory_budget` by
paging idle adapters out to host memory, then to disk, and back in bit for bit on next use.

An adapter's state is its leaves + accumulated gradients + optimizer moments and step
(`AdapterState`); each adapter of the bank is in exactly one tier:
* resident: real tensors in its `LoraAdapter` and in the `Trainer`, in LRU order of last use;
* host: an `AdapterState` of CPU tensors. On a CPU engine that is the same RAM: the move hands
  the tensors over, copies nothing, and only the disk tier bounds memory there;
* disk: a `PageFile` in a private directory under `EngineConfig.page_dir`.
A paged-out adapter stays in the bank as the same object (so its prefix-cache version, and the
cached KV pages keyed by it, stay valid: the bits come back unchanged) with ``meta`` placeholder
leaves, so using it without paging it in fails loudly instead of reading stale tensors.

Policy. `acquire`, before every engine call that touches adapters, pins the call's adapters,
pages out least recently used unpinned ones until the call's adapters fit at their *peak*
footprint (a training adapter: leaves + gradients + two moments + step; a frozen one: leaves),
and pages the call's adapters in. `release` unpins them and pages out LRU adapters until the
resident bytes are within the budget. A call whose own adapters exceed the budget still runs,
over budget for its duration (counted in `PageStats.over_budget_calls`): refusing it would
fail a tenant whose batch can never fit, and waiting would deadlock. Host copies beyond
`EngineConfig.host_memory_budget` spill to disk, oldest first.

Accounting: a resident adapter's bytes change only inside calls that pin it (gradients appear
in forward_backward, moments in its first optim_step), so they are measured when it enters and
when its lease ends, and the totals are kept incrementally; `bytes_resident` re-measures.

Threads: every method holds one lock, and pages move only in calls from the engine's own
thread. `reading` (a checkpoint save on an IO thread) pins its adapter, so no page-out moves
it during the save, and reads the state where it lies, paging nothing in or out.
`memory_stats` returns the snapshot published at the end of the last change, without the lock,
so a stats reader never waits for a page move. Knows nothing of batches, losses, sampling or
the checkpoint format.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.engine.paging.adapter_state import AdapterState
from loraplex.engine.paging.memory_stats import MemoryStats, PageStats
from loraplex.engine.paging.page_file import PageFile
from loraplex.engine.paging.tier import Tier
from loraplex.errors import user_error

#: Bytes of the AdamW step count (a float32 scalar) in an adapter's peak footprint.
STEP_BYTES = 4


class OptimizerStates(Protocol):
    """Where resident adapters keep their optimizer state: the engine's `Trainer`. A Protocol so
    that paging, below the trainer, does not import it."""

    def optimizer_state(self, adapter_id: str) -> OptimizerState | None: ...

    def set_optimizer_state(self, adapter_id: str, state: OptimizerState | None) -> None: ...


@dataclass(frozen=True)
class Lease:
    """What `acquire` pinned for one call, and what it paged out to make room."""

    adapter_ids: tuple[str, ...]
    paged_out: tuple[str, ...]


class AdapterPager:
    """The residency of every adapter of one `AdapterBank` (see the module docstring)."""

    def __init__(self, bank: AdapterBank, trainer: OptimizerStates, *, budget: int | None,
                 host_budget: int | None, page_dir: str | None) -> None:
        """Args:
            bank, trainer: where resident adapters keep their leaves and optimizer state.
            budget: device bytes for resident state (None: unlimited, nothing pages out).
            host_budget: bytes of host copies before spilling to disk (None: unlimited).
            page_dir: where the private page directory is made (None: the system temp dir).

        Raises:
            UserError: a negative budget.
        """
        for name, value in (("adapter_memory_budget", budget),
                            ("host_memory_budget", host_budget)):
            if value is not None and value < 0:
                raise user_error(name, f"must be at least 0 bytes, got {value}")
        self._bank = bank
        self._trainer = trainer
        self.budget = budget
        self.host_budget = host_budget
        self._page_root = page_dir
        self._page_dir: str | None = None  # made on the first page file
        self._num_files = 0
        self._lock = threading.Lock()
        # Resident: least recently used first, each with its bytes when last measured.
        self._resident: Tier[int] = Tier(lambda nbytes: nbytes)
        self._host: Tier[AdapterState] = Tier(lambda state: state.nbytes)
        self._disk: Tier[PageFile] = Tier(lambda page: page.file_bytes)
        self._pins: Counter[str] = Counter()
        self.stats = PageStats()
        self._memory = self._snapshot()

    # ---- adapters entering and leaving -----------------------------------------------------

    def add(self, adapter_id: str) -> None:
        """Track an adapter just put in the bank: resident when its tensors are on the device,
        else (a checkpoint read into host memory) in the host tier. Pages nothing out: the
        caller's `settle` or next `acquire` does."""
        with self._lock:
            self._drop(adapter_id)
            if self._is_on_device(self._bank.get(adapter_id)):
                self._resident.put(adapter_id, self._measure(adapter_id))
            else:
                self._host.put(adapter_id, self._detach(adapter_id))
                self._spill()
            self._publish()

    def forget(self, adapter_id: str) -> None:
        """Drop every copy of an adapter leaving the bank (its page file too)."""
        with self._lock:
            self._drop(adapter_id)
            self._publish()

    # ---- around engine calls ---------------------------------------------------------------

    def acquire(self, adapter_ids: Iterable[str], extra_bytes: int = 0) -> Lease:
        """Pin ``adapter_ids`` (ids not in the bank are skipped) and make them resident.

        Args:
            extra_bytes: device bytes the call adds beside them (a snapshot's frozen copy).

        Returns:
            The lease to `release` after the call.
        """
        with self._lock:
            ids = tuple(dict.fromkeys(a for a in adapter_ids if a in self._bank))
            self._pins.update(ids)
            try:
                paged_out = self._make_room(ids, extra_bytes)
                for adapter_id in ids:
                    self._page_in(adapter_id)
                    self._resident.touch(adapter_id)
            except BaseException:
                self._unpin(ids)
                raise
            finally:
                self._publish()
            return Lease(ids, tuple(paged_out))

    def release(self, lease: Lease) -> list[str]:
        """Unpin a lease's adapters, then `settle`; the adapters paged out."""
        with self._lock:
            self._unpin(lease.adapter_ids)
            for adapter_id in lease.adapter_ids:
                if adapter_id in self._resident:  # the call may have grown or freed its state
                    self._resident.put(adapter_id, self._measure(adapter_id))
            paged_out = self._settle()
            self._publish()
            return paged_out

    def settle(self) -> list[str]:
        """Page out LRU unpinned adapters until the resident bytes fit the budget; their ids."""
        with self._lock:
            paged_out = self._settle()
            self._publish()
            return paged_out

    @contextmanager
    def reading(self, adapter_id: str) -> Iterator[tuple[LoraAdapter, OptimizerState | None]]:
        """The adapter and its optimizer state wherever they lie (paged-out ones as CPU tensors),
        pinned until the block ends; nothing is paged in or out. For checkpoint saves.

        A page file is read after the lock is let go: the pin keeps it in place, and while a
        save runs the engine's thread makes no call about that adapter (the executor
        protocol's rule), so nothing pages it in.

        Raises:
            NotFoundError: no such adapter.
        """
        with self._lock:
            adapter = self._bank.get(adapter_id)
            held, page = self._host.get(adapter_id), self._disk.get(adapter_id)
            optimizer = self._trainer.optimizer_state(adapter_id)
            self._pins[adapter_id] += 1
        try:
            state = held if page is None else page.read("cpu")
            if state is None:
                yield adapter, optimizer
            else:
                leaves = [p.detach().requires_grad_(q.requires_grad)
                          for p, q in zip(state.params, adapter.parameters(), strict=True)]
                yield adapter.with_parameters(leaves), state.optimizer
        finally:
            with self._lock:
                self._unpin([adapter_id])

    # ---- accounting ------------------------------------------------------------------------

    def is_resident(self, adapter_id: str) -> bool:
        return adapter_id in self._resident

    def bytes_resident(self) -> int:
        """Leaves + gradients + moments (+ step) of the resident adapters, measured now."""
        with self._lock:
            return sum(self._measure(a) for a in self._resident.ids())

    def memory_stats(self) -> MemoryStats:
        """As of the end of the last change (any thread, never waits)."""
        return self._memory

    def close(self) -> None:
        """Delete the page directory (every paged-out adapter's disk copy with it)."""
        with self._lock:
            for adapter_id in self._disk.ids():
                self._disk.pop(adapter_id)
            self._publish()
            if self._page_dir is not None:
                shutil.rmtree(self._page_dir, ignore_errors=True)
                self._page_dir = None

    # ---- policy (the lock is held) ---------------------------------------------------------

    def _make_room(self, ids: tuple[str, ...], extra_bytes: int) -> list[str]:
        """Page out LRU unpinned adapters until ``ids`` fit at their peak; count an overflow."""
        if self.budget is None:
            return []
        need = extra_bytes + sum(self._peak_bytes(a) for a in ids)
        others = self._resident.nbytes - sum(self._resident.get(a) or 0 for a in ids)
        paged_out: list[str] = []
        if others + need <= self.budget:
            return paged_out
        for adapter_id in self._resident.ids():
            if others + need <= self.budget:
                break
            if self._pins[adapter_id] == 0:
                others -= self._page_out(adapter_id)
                paged_out.append(adapter_id)
        if others + need > self.budget:
            self.stats.over_budget_calls += 1
            self.stats.max_over_budget_bytes = max(self.stats.max_over_budget_bytes,
                                                   others + need - self.budget)
        return paged_out

    def _settle(self) -> list[str]:
        paged_out: list[str] = []
        if self.budget is None or self._resident.nbytes <= self.budget:
            return paged_out  # the common case: no walk over every resident adapter
        for adapter_id in self._resident.ids():
            if self._resident.nbytes <= self.budget:
                break
            if self._pins[adapter_id] == 0:
                self._page_out(adapter_id)
                paged_out.append(adapter_id)
        return paged_out

    def _spill(self) -> None:
        """Write the oldest unpinned host copies to disk until the host tier fits its budget."""
        if self.host_budget is None:
            return
        for adapter_id in self._host.ids():
            if self._host.nbytes <= self.host_budget:
                break
            if self._pins[adapter_id] == 0:
                with self._timed():
                    self._disk.put(adapter_id, self._write(self._host.pop(adapter_id)))

    def _unpin(self, adapter_ids: Iterable[str]) -> None:
        self._pins.subtract(adapter_ids)
        self._pins = +self._pins  # drop the zeros

    # ---- moves (the lock is held) ----------------------------------------------------------

    def _page_out(self, adapter_id: str) -> int:
        """Move a resident adapter to host memory (or straight to disk); the device bytes
        freed."""
        with self._timed():
            state = self._detach(adapter_id)
            freed = self._resident.pop(adapter_id)
            if self.host_budget == 0:
                self._disk.put(adapter_id, self._write(state))
            else:
                host, copied = state.to("cpu")
                self._host.put(adapter_id, host)
                self.stats.bytes_to_host += copied
            self.stats.page_outs += 1
        self._spill()
        return freed

    def _page_in(self, adapter_id: str) -> None:
        if adapter_id in self._resident:
            return
        if adapter_id not in self._host and adapter_id not in self._disk:
            # Put in the bank behind the pager's back: adopted as it is.
            self._resident.put(adapter_id, self._measure(adapter_id))
            return
        with self._timed():
            device = self._bank.device
            if adapter_id in self._host:
                state, copied = self._host.pop(adapter_id).to(device)
                self.stats.bytes_from_host += copied
            else:
                page = self._disk.pop(adapter_id)
                state = page.read(device)
                page.delete()
                self.stats.from_disk += 1
                self.stats.bytes_from_disk += page.file_bytes
            self._attach(adapter_id, state)
            self._resident.put(adapter_id, self._measure(adapter_id))
            self.stats.page_ins += 1

    def _detach(self, adapter_id: str) -> AdapterState:
        """Take the adapter's state out of it (placeholder leaves) and out of the trainer."""
        adapter = self._bank.get(adapter_id)
        state = AdapterState.of(adapter, self._trainer.optimizer_state(adapter_id))
        adapter.set_parameters([torch.empty(p.shape, dtype=p.dtype, device="meta")
                                .requires_grad_(p.requires_grad) for p in adapter.parameters()])
        self._trainer.set_optimizer_state(adapter_id, None)
        return state

    def _attach(self, adapter_id: str, state: AdapterState) -> None:
        """Give a paged-in state back to its adapter (leaves, gradients) and the trainer."""
        adapter = self._bank.get(adapter_id)
        leaves = [p.requires_grad_(q.requires_grad)
                  for p, q in zip(state.params, adapter.parameters(), strict=True)]
        for leaf, grad in zip(leaves, state.grads, strict=True):
            if grad is not None:
                leaf.grad = grad
        adapter.set_parameters(leaves)
        if state.optimizer is not None:
            self._trainer.set_optimizer_state(adapter_id, state.optimizer)

    def _write(self, state: AdapterState) -> PageFile:
        if self._page_dir is None:
            if self._page_root is not None:
                os.makedirs(self._page_root, exist_ok=True)
            self._page_dir = tempfile.mkdtemp(prefix="loraplex-pages-", dir=self._page_root)
            weakref.finalize(self, shutil.rmtree, self._page_dir, True)
        self._num_files += 1
        page = PageFile.write(state, os.path.join(self._page_dir,
                                                  f"{self._num_files:08d}.safetensors"))
        self.stats.to_disk += 1
        self.stats.bytes_to_disk += page.file_bytes
        return page

    def _drop(self, adapter_id: str) -> None:
        self._resident.discard(adapter_id)
        self._host.discard(adapter_id)
        if (page := self._disk.discard(adapter_id)) is not None:
            page.delete()

    def _snapshot(self) -> MemoryStats:
        return MemoryStats(
            num_resident=len(self._resident), num_host=len(self._host), num_disk=len(self._disk),
            bytes_resident=self._resident.nbytes, bytes_host=self._host.nbytes,
            bytes_disk=self._disk.nbytes, budget_bytes=self.budget,
            host_budget_bytes=self.host_budget, paging=replace(self.stats))

    def _publish(self) -> None:
        self._memory = self._snapshot()  # one assignment: readers see the old or the new

    # ---- sizes -----------------------------------------------------------------------------

    def _measure(self, adapter_id: str) -> int:
        """Current device bytes of a resident adapter: leaves, gradients, optimizer state."""
        optimizer = self._trainer.optimizer_state(adapter_id)
        return self._bank.get(adapter_id).nbytes() + (optimizer.nbytes if optimizer else 0)

    def _peak_bytes(self, adapter_id: str) -> int:
        """The most a call can make an adapter hold: leaves, + gradients, two moments and the
        step when it trains."""
        adapter = self._bank.get(adapter_id)
        params = sum(p.numel() * p.element_size() for p in adapter.parameters())
        return 4 * params + STEP_BYTES if adapter.is_trainable else params

    def _is_on_device(self, adapter: LoraAdapter) -> bool:
        device, here = self._bank.device, adapter.parameters()[0].device
        return here.type == device.type and (device.index is None or here.index == device.index)

    @contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stats.seconds += time.perf_counter() - start
