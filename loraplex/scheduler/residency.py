"""Which sampler adapter versions live in the engine, who is using them, and which to drop.

Versions are created by ephemeral ``save_weights_for_sampler`` (snapshots, kept per training
run up to a cap; ``inflight`` keeps only the latest) and loaded lazily from checkpoint
directories (kept in LRU order up to a cap). A version a running sample still uses is never
dropped: eviction marks it doomed and `take_releasable` hands it out once its last user finishes.
Which checkpoint adapters the engine holds is tracked here too (`mark_installed`), so planning
never asks the executor (a remote call for a Ray worker) while the scheduler's lock is held.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, defaultdict
from dataclasses import replace

from loraplex.domain.ops import SampleOp, WorkItem
from loraplex.errors import user_error


def sample_op(item: WorkItem) -> SampleOp:
    """The sample request a sampling-queue item carries."""
    if not isinstance(item.op, SampleOp):
        raise AssertionError(f"{item.request_id}: {item.kind} in the sampling queue")
    return item.op


class AdapterResidency:
    """Bookkeeping only; the scheduler turns `take_releasable` into engine deletes.

    Args:
        max_snapshots_per_model: newest snapshot versions kept per training run.
        max_checkpoint_adapters: checkpoint-backed sampler adapters kept loaded.
    """

    def __init__(self, max_snapshots_per_model: int, max_checkpoint_adapters: int) -> None:
        self.max_snapshots_per_model = max(1, max_snapshots_per_model)
        self.max_checkpoint_adapters = max(1, max_checkpoint_adapters)
        self._snapshots: dict[str, list[str]] = defaultdict(list)
        self._inflight: dict[str, str] = {}
        self._checkpoints: OrderedDict[str, None] = OrderedDict()
        self._live: set[str] = set()
        self._refs: Counter[str] = Counter()
        self._doomed: set[str] = set()
        self._installed: set[str] = set()
        self._reading: set[str] = set()  # checkpoint adapters being read or awaiting install

    def add_snapshot(self, model_id: str, adapter_id: str, *, inflight: bool) -> None:
        self._live.add(adapter_id)
        if inflight:
            old = self._inflight.get(model_id)
            self._inflight[model_id] = adapter_id
            if old is not None:
                self._doom(old)
            return
        versions = self._snapshots[model_id]
        versions.append(adapter_id)
        while len(versions) > self.max_snapshots_per_model:
            self._doom(versions.pop(0))

    def bind(self, op: SampleOp) -> SampleOp:
        """``op`` with the adapter version it samples: an ``inflight`` sampler gets its run's
        latest inflight save.

        Raises:
            UserError: the snapshot behind a snapshot / inflight sampler is gone.
        """
        adapter_id = op.work.adapter_id
        if op.source == "inflight":
            assert op.model_id is not None
            adapter_id = self.current_inflight(op.model_id)
        if op.source in ("snapshot", "inflight") and (
                adapter_id is None or not self.is_live(adapter_id)):
            raise user_error("sampling_session_id", "the weights snapshot behind this sampling "
                             "session is gone (evicted by newer snapshots, its training session "
                             "ended, or the server restarted); save weights for sampler again")
        if adapter_id == op.work.adapter_id:
            return op
        return replace(op, work=replace(op.work, adapter_id=adapter_id))

    def admit(self, op: SampleOp) -> None:
        """A sample starts running: its adapter is in use until `release`."""
        adapter_id = op.work.adapter_id
        if adapter_id is not None:
            if op.source == "checkpoint":
                self.use_checkpoint(adapter_id)
            self.acquire(adapter_id)

    def current_inflight(self, model_id: str) -> str | None:
        return self._inflight.get(model_id)

    def is_live(self, adapter_id: str) -> bool:
        return adapter_id in self._live

    def use_checkpoint(self, adapter_id: str) -> None:
        """A sample is about to use a checkpoint-backed adapter (the engine loads it lazily)."""
        self._live.add(adapter_id)
        self._doomed.discard(adapter_id)
        self._checkpoints[adapter_id] = None
        self._checkpoints.move_to_end(adapter_id)
        while len(self._checkpoints) > self.max_checkpoint_adapters:
            oldest, _ = self._checkpoints.popitem(last=False)
            self._doom(oldest)

    def acquire(self, adapter_id: str) -> None:
        self._refs[adapter_id] += 1

    def release(self, adapter_id: str) -> None:
        self._refs[adapter_id] -= 1
        if self._refs[adapter_id] <= 0:
            del self._refs[adapter_id]

    def drop_model(self, model_id: str) -> None:
        """Forget every sampler version derived from a training run being released."""
        for adapter_id in self._snapshots.pop(model_id, []):
            self._doom(adapter_id)
        inflight = self._inflight.pop(model_id, None)
        if inflight is not None:
            self._doom(inflight)

    def drop_prefix(self, prefix: str) -> None:
        """Doom every live version whose id starts with ``prefix``."""
        for adapter_id in sorted(a for a in self._live if a.startswith(prefix)):
            self._doom(adapter_id)

    def mark_installed(self, adapter_id: str) -> None:
        """A checkpoint adapter was read and installed into the engine."""
        self._installed.add(adapter_id)

    def is_installed(self, adapter_id: str) -> bool:
        """Whether a checkpoint adapter is in the engine (installed, not yet released)."""
        return adapter_id in self._installed

    def needs_read(self, op: SampleOp) -> bool:
        """Whether a waiting checkpoint sample's adapter must still be read from its dir."""
        adapter_id = op.work.adapter_id
        return (op.source == "checkpoint" and adapter_id is not None
                and op.work.adapter_dir is not None and adapter_id not in self._reading
                and adapter_id not in self._installed)

    def is_ready(self, op: SampleOp) -> bool:
        """A waiting sample may be admitted: its adapter is resident (or needs no reading)."""
        return op.work.adapter_id not in self._reading and not self.needs_read(op)

    def start_reading(self, adapter_id: str) -> None:
        self._reading.add(adapter_id)

    def done_reading(self, adapter_id: str) -> None:
        """The read ended (installed, or failed)."""
        self._reading.discard(adapter_id)

    def take_releasable(self) -> list[str]:
        """Doomed versions no running sample uses any more (removed from the bookkeeping:
        the engine deletes them)."""
        ready = sorted(a for a in self._doomed if self._refs[a] <= 0)
        self._doomed.difference_update(ready)
        self._installed.difference_update(ready)
        return ready

    def _doom(self, adapter_id: str) -> None:
        self._live.discard(adapter_id)
        self._checkpoints.pop(adapter_id, None)
        self._doomed.add(adapter_id)
