"""`ModelParallelGroup`: N engine workers that together hold one copy of the base model, as
pipeline stages (`engine.model.stage`), behind the scheduler's `BatchExecutor` protocol.

Every protocol call goes to every rank, in the same order (SPMD): each runs the same
bookkeeping on its own stage and the ranks exchange activations among themselves
(`engine.model.stage_pipe`); the group answers with the last stage's outcomes (it holds the
head: losses, logprobs, sampled tokens). Checkpoints: each rank hands over its rows of the
adapter and the group writes them joined (`engine.group_checkpoint`), the same files as one
engine; reads are per rank. A rank that dies, or fails with anything but a domain error, fails
the whole group with `WorkerLostError` (its stages' state can no longer be trusted): the lane
stops, its runs are restored elsewhere from their latest ``save_state`` and a new group is
started, as for a lost worker. Ranks are `RankHandle`s: local child processes or Ray actors.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import dataclass, replace
from typing import Any, Protocol

from loraplex.cluster.memory_cache import MemoryCache
from loraplex.cluster.worker import PreparedHandle, Raised, WithMemory
from loraplex.domain.cycle import CallCrash, CycleOutcome
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.results import (
    AdapterMemory,
    FwdBwdOutcome,
    LoadResult,
    OptimOutcome,
    PreparedAdapter,
    SampleStep,
    SaveResult,
)
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SampleWork, SaveWork
from loraplex.errors import WorkerLostError

log = logging.getLogger("loraplex.cluster")


class RankHandle(Protocol):
    """One rank as the group sees it."""

    name: str

    def submit(self, method: str, *args: Any) -> Future[Any]:
        """Call ``method`` on the rank; the future fails with `WorkerLostError` if it died."""
        ...

    def kill(self) -> None:
        """End the rank now."""
        ...


@dataclass(frozen=True)
class GroupPrepared:
    """A checkpoint every rank read (its rows), ready to install."""

    handles: tuple[PreparedHandle, ...]

    @property
    def config(self) -> LoraConfig:
        return self.handles[0].config


class ModelParallelGroup:
    """One engine worker made of ``len(ranks)`` pipeline stages (see the module docstring).

    Args:
        name: for logs and errors (``group pid1+pid2``).
        ranks: the stages' workers, in stage order, already up.
        info: the model's facts (the ranks' ``ready``).
        weight_bytes: base-weight bytes each rank holds (reported in stats and benchmarks).
        save: writes the ranks' joined shares as one checkpoint (``group_checkpoint``).
        on_close: releases what the group's placement held (a Ray placement group).
    """

    def __init__(self, name: str, ranks: Sequence[RankHandle], info: ModelInfo,
                 weight_bytes: Sequence[int], save: Callable[[SaveWork, list[Any]], int],
                 on_close: Callable[[], None] | None = None) -> None:
        self.name = name
        self.ranks = list(ranks)
        self.weight_bytes = list(weight_bytes)
        self._info = info
        self._save = save
        self._on_close = on_close
        self._lost: str | None = None
        self._io_lock = threading.Lock()
        self._memory = MemoryCache()

    def model_info(self) -> ModelInfo:
        return self._info

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        if config.seed is None:  # every stage must draw its rows of the same init
            config = replace(config, seed=secrets.randbits(63))
        self._memory.changing()
        self._all("create_adapter", adapter_id, config)

    def delete_adapter(self, adapter_id: str) -> None:
        self._memory.changing()
        self._all("delete_adapter", adapter_id)

    def has_adapter(self, adapter_id: str) -> bool:
        return bool(self._all("has_adapter", adapter_id))

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        self._memory.changing()
        return list(self._all("forward_backward", list(works)))

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        self._memory.changing()
        return list(self._all("optim_step", list(works)))

    def run_cycle(self, fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork]
                  ) -> CycleOutcome:
        """One call per rank (`EngineWorker.run_cycle`): the last stage's outcomes, or for
        each part a rank's domain error (every rank returns the same one)."""
        cycles: list[CycleOutcome] = self._with_memory("run_cycle", list(fwd_bwd), list(optim))
        last = cycles[-1]
        fwd_bwd_out = next((c.forward_backward for c in cycles
                            if isinstance(c.forward_backward, CallCrash)), last.forward_backward)
        optim_out = next((c.optim_step for c in cycles if isinstance(c.optim_step, CallCrash)),
                         last.optim_step)
        return replace(last, forward_backward=fwd_bwd_out, optim_step=optim_out)

    def save_adapter(self, work: SaveWork) -> SaveResult:
        with self._io_lock:  # one save's shares at a time: they can be large
            shares = self._every("adapter_share", work.adapter_id, work.with_optimizer)
        return SaveResult(self._save(work, shares))

    def read_checkpoint(self, work: LoadWork) -> PreparedAdapter:
        handles = self._every("read_checkpoint", work)
        return GroupPrepared(tuple(handles))

    def install_adapter(self, adapter_id: str, prepared: PreparedAdapter) -> LoadResult:
        if not isinstance(prepared, GroupPrepared):
            raise TypeError(f"not a checkpoint read by group {self.name}")
        self._memory.changing()
        results = self._call([rank.submit("install_adapter", adapter_id, handle.token)
                              for rank, handle in zip(self.ranks, prepared.handles, strict=True)])
        result: LoadResult = results[-1]
        return result

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        self._memory.changing()
        self._all("snapshot_adapter", src_adapter_id, dst_adapter_id)

    def sample_step(self, admit: Sequence[SampleWork], max_decode_steps: int,
                    cancel: Sequence[str] = ()) -> SampleStep:
        steps = self._with_memory("sample_step", list(admit), max_decode_steps, list(cancel))
        step: SampleStep = steps[-1]
        return step

    def num_running_samples(self) -> int:
        return int(self._all("num_running_samples"))

    def release_memory(self) -> None:
        self._all("release_memory")

    def adapter_memory(self) -> AdapterMemory:
        """The ranks' adapter memory added up (`_joined_memory`), as of the group's last call
        (`MemoryCache`)."""
        if self._lost is not None:
            raise WorkerLostError(self._lost)
        return self._memory.get(lambda: _joined_memory(self._every("adapter_memory")))

    def close(self) -> None:
        """End every rank (a later call finds the group lost)."""
        self._lost = self._lost or f"engine group {self.name} was closed"
        for rank in self.ranks:
            rank.kill()
        if self._on_close is not None:
            self._on_close()

    # ---- calls -----------------------------------------------------------------------------

    def _all(self, method: str, *args: Any) -> Any:
        """``method`` on every rank; the last stage's answer."""
        return self._every(method, *args)[-1]

    def _every(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every rank; every rank's answer, in stage order."""
        return self._call([rank.submit(method, *args) for rank in self.ranks])

    def _call(self, futures: list[Future[Any]]) -> list[Any]:
        """Wait for every rank; a domain error a rank returned is raised (every rank returns
        the same one); a lost or failing rank loses the group."""
        if self._lost is not None:
            raise WorkerLostError(self._lost)
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            self._lose(failed.exception())
        values = [f.result() for f in futures]
        for value in values:
            if isinstance(value, Raised):
                raise value.error
        return values

    def _with_memory(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every rank, each answering `WithMemory`: every rank's answer; their
        memory, joined, is kept."""
        version = self._memory.changing()
        answers: list[WithMemory[Any]] = self._every(method, *args)
        self._memory.put(version, _joined_memory([a.memory for a in answers]))
        return [a.answer for a in answers]

    def _lose(self, cause: BaseException | None) -> None:
        """Declare the group lost: stop every rank (the survivors may be blocked waiting on
        the lost one) and raise."""
        lost = f"engine group {self.name} was lost ({cause})"
        log.error("%s; stopping its ranks", lost)
        self._lost = lost
        self.close()
        raise WorkerLostError(lost)



def _joined_memory(parts: list[AdapterMemory]) -> AdapterMemory:
    """A group's adapter memory from its ranks' (each holds its layers' rows of every adapter;
    budgets are per rank, so the group's is their sum)."""
    budgets = [m.budget_bytes for m in parts]
    return AdapterMemory(
        resident_adapters=max(m.resident_adapters for m in parts),
        bytes_resident=sum(m.bytes_resident for m in parts),
        budget_bytes=None if None in budgets else sum(b or 0 for b in budgets),
        paged_adapters=max(m.paged_adapters for m in parts),
        bytes_host=sum(m.bytes_host for m in parts),
        bytes_disk=sum(m.bytes_disk for m in parts),
        page_outs=sum(m.page_outs for m in parts), page_ins=sum(m.page_ins for m in parts))
