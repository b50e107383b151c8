"""`Engine`: the torch implementation of the scheduler's `BatchExecutor` protocol.

Composes the base model (`load_model`), the adapter bank, the training path (`Trainer`), the
sampler and checkpoint IO behind the protocol's methods; holds no algorithm of its own.
Satisfies the protocol structurally (the engine never imports the scheduler). Not thread-safe:
the scheduler calls it from its single worker thread, one method at a time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.results import LoadResult, SaveResult
from loraplex.domain.sampling import SampleResult
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SampleWork, SaveWork
from loraplex.engine.checkpoint_io import load_checkpoint, save_checkpoint
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.loader import load_model
from loraplex.engine.optim.adamw_state import AdamWState
from loraplex.engine.peft_export import write_peft_adapter
from loraplex.engine.sampling.sampler import Sampler
from loraplex.engine.trainer import FwdBwdOutcome, OptimOutcome, Trainer, is_trainable
from loraplex.errors import LoraplexError, NotFoundError

SampleOutcome = tuple[str, SampleResult | LoraplexError]


class Engine:
    """One frozen base model and every adapter beside it (see the module docstring).

    Attributes:
        model_dir: the base model's directory (also ``base_model_name_or_path`` of PEFT
            exports).
        model, bank, trainer: the parts it delegates to (and `sampler`, built on first use).
    """

    def __init__(self, model_dir: str, config: EngineConfig) -> None:
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.model_dir = os.path.abspath(model_dir)
        self.model = load_model(self.model_dir, config)
        self.bank = AdapterBank(self.model.spec, self.model.device, config.max_lora_rank)
        self._info = self.model.model_info(config.max_context)
        self.trainer = Trainer(self.model, self.bank, self._info.max_context)
        self._config = config
        self._sampler: Sampler | None = None  # built on first use: its KV cache is big

    def model_info(self) -> ModelInfo:
        return self._info

    # ---- adapters ----------------------------------------------------------------------------

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        self.bank.create(adapter_id, config)

    def delete_adapter(self, adapter_id: str) -> None:
        self.bank.delete(adapter_id)
        self.trainer.forget(adapter_id)
        self._weights_changed([adapter_id])

    def has_adapter(self, adapter_id: str) -> bool:
        return adapter_id in self.bank

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        self.bank.snapshot(src_adapter_id, dst_adapter_id)

    def ensure_adapter(self, adapter_id: str, adapter_dir: str | None) -> None:
        """Make ``adapter_id`` resident, loading its weights (frozen) from ``adapter_dir``.

        Raises:
            NotFoundError: not resident and no directory to load it from.
            UserError: the directory holds no usable checkpoint.
        """
        if adapter_id in self.bank:
            return
        if adapter_dir is None:
            raise NotFoundError(f"adapter {adapter_id!r} is not loaded", field="model_id")
        loaded = load_checkpoint(adapter_dir, self.model.spec, self.model.device,
                                 with_optimizer=False, trainable=False)
        self.bank.put(adapter_id, loaded.adapter)

    # ---- training ----------------------------------------------------------------------------

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        return self.trainer.forward_backward(works)

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        outcomes = self.trainer.optim_step(works)
        self._weights_changed([w.adapter_id for w in works])
        return outcomes

    # ---- checkpoints -------------------------------------------------------------------------

    def save_adapter(self, work: SaveWork) -> SaveResult:
        """Weights (+ AdamW state, zeros before the first step) (+ PEFT files), atomically."""
        adapter = self.bank.get(work.adapter_id)
        optimizer = None
        if work.with_optimizer and is_trainable(adapter):
            optimizer = self.trainer.optimizer_state(work.adapter_id)
            if optimizer is None:  # no step yet: save zero moments without keeping them
                named = adapter.named_parameters()
                optimizer = AdamWState.zeros([n for n, _ in named], [p for _, p in named])

        def peft(directory: str) -> None:
            write_peft_adapter(directory, adapter, self.model_dir)

        size = save_checkpoint(work.directory, adapter, self.model.spec, optimizer,
                               peft if work.peft_export else None)
        return SaveResult(size)

    def load_adapter(self, work: LoadWork) -> LoadResult:
        """Replace (or create) ``work.adapter_id`` from a checkpoint, as a training adapter.

        Without ``with_optimizer`` the AdamW moments and step restart from zero. Any gradients
        accumulated in the replaced adapter are dropped. Nothing changes if loading fails.
        """
        loaded = load_checkpoint(work.directory, self.model.spec, self.model.device,
                                 with_optimizer=work.with_optimizer, trainable=True,
                                 expect_config=work.expect_config)
        loaded.adapter.config.validate(self.bank.max_rank, field="path")
        self.bank.delete(work.adapter_id)
        self.bank.put(work.adapter_id, loaded.adapter)
        self.trainer.set_optimizer_state(work.adapter_id, loaded.optimizer)
        self._weights_changed([work.adapter_id])
        return LoadResult(loaded.adapter.config)

    # ---- sampling ----------------------------------------------------------------------------

    def sample_step(self, admit: Sequence[SampleWork], max_decode_steps: int
                    ) -> list[SampleOutcome]:
        return self.sampler.step(admit, max_decode_steps)

    def num_running_samples(self) -> int:
        return 0 if self._sampler is None else self._sampler.num_running()

    @property
    def sampler(self) -> Sampler:
        """The sampler, created (with its KV cache) the first time sampling is used."""
        if self._sampler is None:
            self._sampler = Sampler(self.model, self.bank, self._config, self.model_dir,
                                    self.ensure_adapter)
        return self._sampler

    def _weights_changed(self, adapter_ids: Sequence[str]) -> None:
        """Tell the sampler that cached prefixes of these adapters are stale."""
        if self._sampler is not None:
            for adapter_id in adapter_ids:
                self._sampler.invalidate_adapter(adapter_id)
