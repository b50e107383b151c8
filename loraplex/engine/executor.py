"""`Engine`: the torch implementation of the scheduler's `BatchExecutor` protocol.

Composes the base model (`load_model`), the adapter bank, the training path (`Trainer`), the
adapter pager, the sampler and checkpoint IO behind the protocol's methods; holds no algorithm
of its own. Every call that touches adapters runs inside a pager lease (`_resident`): its
adapters are paged in and pinned first, and idle ones paged out to keep the memory budget.
Satisfies the protocol structurally (the engine never imports the scheduler). Threads: one
worker thread makes every call, except `save_adapter` and `read_checkpoint`, which may run on
IO threads beside calls about other adapters (the pager's lock and pins keep a save's adapter
in place). The model is loaded on a thread of its own that ends, so that no OpenMP team but
the worker thread's survives construction (`domain.passing_thread`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch

from loraplex.config import EngineConfig
from loraplex.domain.cycle import CycleOutcome, run_cycle_calls
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.passing_thread import in_passing_thread
from loraplex.domain.results import (
    AdapterMemory,
    FwdBwdOutcome,
    LoadResult,
    OptimOutcome,
    PreparedAdapter,
    SampleOutcome,
    SampleStep,
    SaveResult,
)
from loraplex.domain.sampling import cancelled_error
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SampleWork, SaveWork
from loraplex.engine.checkpoint_io import LoadedAdapter, load_checkpoint, save_checkpoint
from loraplex.engine.group_checkpoint import AdapterShare
from loraplex.engine.host_allocator import release_freed_memory, retain_freed_memory
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.stage_pipe import StagePipe
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.engine.paging.memory_stats import MemoryStats
from loraplex.engine.paging.pager import AdapterPager
from loraplex.engine.peft_export import write_peft_adapter
from loraplex.engine.sampling.sampler import Sampler
from loraplex.engine.trainer import Trainer, is_trainable
from loraplex.errors import NotFoundError


class Engine:
    """One frozen base model and every adapter beside it (see the module docstring).

    Attributes:
        model_dir: the base model's directory (also ``base_model_name_or_path`` of PEFT
            exports).
        model, bank, trainer, pager: the parts it delegates to (and `sampler`, built on
            first use).
    """

    def __init__(self, model_dir: str, config: EngineConfig, pipe: StagePipe | None = None
                 ) -> None:
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        if config.retain_host_memory:
            retain_freed_memory()
        self.model_dir = os.path.abspath(model_dir)
        self.pipe = pipe
        stage = None if pipe is None else pipe.stage
        # Loading runs parallel ops: on a passing thread, so that the thread that computes
        # stays the process's only OpenMP team (see `domain.passing_thread`).
        self.model = in_passing_thread(
            lambda: load_model(self.model_dir, config, stage, None if pipe is None
                               else pipe.device), "loraplex-load")
        self.bank = AdapterBank(self.model.spec, self.model.device, config.max_lora_rank)
        self._info = replace(self.model.model_info(config.max_context),
                             compute=self.model.options.label(self.model.device, self.model.dtype))
        self.trainer = Trainer(self.model, self.bank, self._info.max_context, pipe)
        self.pager = AdapterPager(self.bank, self.trainer, budget=config.adapter_memory_budget,
                                  host_budget=config.host_memory_budget,
                                  page_dir=config.page_dir)
        # Under a budget, checkpoints are read into host memory (the pager pages them in on
        # use), so reads on IO threads never take device memory outside the budget.
        self._read_device = (self.model.device if config.adapter_memory_budget is None
                             else torch.device("cpu"))
        self._config = config
        self._sampler: Sampler | None = None  # built on first use: its KV cache is big

    def model_info(self) -> ModelInfo:
        return self._info

    def memory_stats(self) -> MemoryStats:
        """Where adapter state lives (device, host, disk), the budgets and paging counters, as
        of the end of the last call; any thread, never waits for a page move."""
        return self.pager.memory_stats()

    def adapter_memory(self) -> AdapterMemory:
        """`memory_stats` in the scheduler's vocabulary (placement, the stats view)."""
        m = self.pager.memory_stats()
        return AdapterMemory(resident_adapters=m.num_resident, bytes_resident=m.bytes_resident,
                             budget_bytes=m.budget_bytes, paged_adapters=m.num_host + m.num_disk,
                             bytes_host=m.bytes_host, bytes_disk=m.bytes_disk,
                             page_outs=m.paging.page_outs, page_ins=m.paging.page_ins)

    def close(self) -> None:
        """Delete the paged-out adapters' scratch files (the engine is not used after)."""
        self.pager.close()

    # ---- adapters ----------------------------------------------------------------------------

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        self.bank.create(adapter_id, config)
        self.pager.add(adapter_id)
        self._drop_stacks(self.pager.settle())

    def delete_adapter(self, adapter_id: str) -> None:
        self.pager.forget(adapter_id)
        self.bank.delete(adapter_id)
        self.trainer.forget(adapter_id)
        self._weights_changed([adapter_id])

    def has_adapter(self, adapter_id: str) -> bool:
        return adapter_id in self.bank

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        copy_bytes = 4 * self.bank.get(src_adapter_id).num_params  # the frozen fp32 copy
        with self._resident([src_adapter_id], extra_bytes=copy_bytes):
            self.bank.snapshot(src_adapter_id, dst_adapter_id)
            self.pager.add(dst_adapter_id)

    # ---- training ----------------------------------------------------------------------------

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        with self._resident(w.adapter_id for w in works):
            return self.trainer.forward_backward(works)

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        with self._resident(w.adapter_id for w in works):
            outcomes = self.trainer.optim_step(works)
            self._weights_changed([w.adapter_id for w in works])
        return outcomes

    def run_cycle(self, fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork]
                  ) -> CycleOutcome:
        """`forward_backward`, then `optim_step` (`domain.cycle.run_cycle_calls`)."""
        return run_cycle_calls(self.forward_backward, self.optim_step, fwd_bwd, optim)

    # ---- checkpoints -------------------------------------------------------------------------

    def save_adapter(self, work: SaveWork) -> SaveResult:
        """Weights (+ optimizer state, zeros before the first step) (+ PEFT files), atomically.
        A paged-out adapter is saved from its host or disk copy, without paging it in."""
        with self.pager.reading(work.adapter_id) as (adapter, state):
            optimizer = None
            if work.with_optimizer and is_trainable(adapter):
                optimizer = state
                if optimizer is None:  # no step yet: save zero moments without keeping them
                    named = adapter.named_parameters()
                    optimizer = OptimizerState.zeros([n for n, _ in named], [p for _, p in named])

            def peft(directory: str) -> None:
                write_peft_adapter(directory, adapter, self.model_dir)

            size = save_checkpoint(work.directory, adapter, self.model.spec, optimizer,
                                   peft if work.peft_export else None)
        return SaveResult(size)

    def adapter_share(self, adapter_id: str, with_optimizer: bool) -> AdapterShare:
        """This engine's tensors of an adapter (a pipeline stage's rows: `group_checkpoint`),
        CPU copies; like `save_adapter`, without paging anything and on any thread."""
        with self.pager.reading(adapter_id) as (adapter, state):
            weights = {n: p.detach().to("cpu", copy=True) for n, p in adapter.named_parameters()}
            optimizer = None
            if with_optimizer and is_trainable(adapter):
                if state is None:  # no step yet: zero moments
                    named = adapter.named_parameters()
                    state = OptimizerState.zeros([n for n, _ in named], [p for _, p in named])
                optimizer = state.state_dict()
        return AdapterShare(adapter.config, weights, optimizer)

    def read_checkpoint(self, work: LoadWork) -> LoadedAdapter:
        """Read and check a checkpoint (frozen for a sampler, else a training adapter with
        its optimizer state when asked). Touches no resident adapter, so it may run on an IO
        thread beside the engine's other calls.

        Raises:
            UserError: no usable checkpoint there, a different base model, a config differing
                from ``work.expect_config``, a rank above the maximum, or missing optimizer state.
        """
        loaded = load_checkpoint(work.directory, self.model.spec, self._read_device,
                                 with_optimizer=work.with_optimizer and not work.frozen,
                                 trainable=not work.frozen, expect_config=work.expect_config)
        loaded.adapter.config.validate(self.bank.max_rank, field="path")
        return loaded

    def install_adapter(self, adapter_id: str, prepared: PreparedAdapter) -> LoadResult:
        """Make a read checkpoint resident as ``adapter_id``, replacing an adapter of that id.

        A training adapter's optimizer moments and step come from the checkpoint, or restart from
        zero when it was read without them; gradients accumulated in the replaced adapter are
        dropped.
        """
        if not isinstance(prepared, LoadedAdapter):
            raise TypeError(f"not a checkpoint read by this engine: {type(prepared).__name__}")
        self.pager.forget(adapter_id)
        self.bank.delete(adapter_id)
        self.bank.put(adapter_id, prepared.adapter)
        self.trainer.set_optimizer_state(
            adapter_id, prepared.optimizer if is_trainable(prepared.adapter) else None)
        self.pager.add(adapter_id)
        self._weights_changed([adapter_id])
        self._drop_stacks(self.pager.settle())
        return LoadResult(prepared.config)

    def load_adapter(self, work: LoadWork) -> LoadResult:
        """`read_checkpoint` then `install_adapter`, in one call (nothing changes if reading
        fails)."""
        return self.install_adapter(work.adapter_id, self.read_checkpoint(work))

    # ---- sampling ----------------------------------------------------------------------------

    def sample_step(self, admit: Sequence[SampleWork], max_decode_steps: int,
                    cancel: Sequence[str] = ()) -> SampleStep:
        """Cancel ``cancel``, page in the admitted and running requests' adapters, then step
        the sampler. Adapters are resident by protocol (the scheduler reads a checkpoint on
        an IO thread and installs it before it admits its samples): an admitted request whose
        adapter this engine does not hold fails alone with a `NotFoundError`; nothing is read
        from disk on this thread."""
        cancelled = self.sampler.cancel(cancel, cancelled_error()) if cancel else []
        ready, failed = self._with_held_adapters(admit)
        needed = [w.adapter_id for w in ready if w.adapter_id is not None]
        with self._resident([*needed, *self.sampler.adapter_ids()]):
            finished = self.sampler.step(ready, max_decode_steps)
        return SampleStep((*cancelled, *failed, *finished), tuple(self.sampler.progress()))

    def num_running_samples(self) -> int:
        return 0 if self._sampler is None else self._sampler.num_running()

    def release_memory(self) -> None:
        if self._config.retain_host_memory:
            release_freed_memory()

    @property
    def sampler(self) -> Sampler:
        """The sampler, created (with its KV cache) the first time sampling is used."""
        if self._sampler is None:
            self._sampler = Sampler(self.model, self.bank, self._config, self.model_dir,
                                    self.pipe)
        return self._sampler

    def _with_held_adapters(self, works: Sequence[SampleWork]
                            ) -> tuple[list[SampleWork], list[SampleOutcome]]:
        """The works whose adapter is in the bank, and the failures of the others."""
        ready: list[SampleWork] = []
        failed: list[SampleOutcome] = []
        for work in works:
            if work.adapter_id is not None and work.adapter_id not in self.bank:
                failed.append((work.request_id, NotFoundError(
                    f"adapter {work.adapter_id!r} is not loaded on this engine",
                    field="model_path")))
            else:
                ready.append(work)
        return ready, failed

    @contextmanager
    def _resident(self, adapter_ids: Iterable[str], extra_bytes: int = 0) -> Iterator[None]:
        """Page ``adapter_ids`` in and pin them for the block (see `AdapterPager.acquire`)."""
        lease = self.pager.acquire(adapter_ids, extra_bytes)
        self._drop_stacks(lease.paged_out)
        try:
            yield
        finally:
            self._drop_stacks(self.pager.release(lease))

    def _drop_stacks(self, paged_out: Iterable[str]) -> None:
        """Free the sampler's stacked copies of paged-out adapters (their versions stay)."""
        if self._sampler is not None:
            for adapter_id in paged_out:
                self._sampler.drop_stacks(adapter_id)

    def _weights_changed(self, adapter_ids: Sequence[str]) -> None:
        """Tell the sampler that cached prefixes of these adapters are stale."""
        if self._sampler is not None:
            for adapter_id in adapter_ids:
                self._sampler.invalidate_adapter(adapter_id)
