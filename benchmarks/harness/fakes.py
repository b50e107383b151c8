"""`NoopExecutor`: a `BatchExecutor` that answers every engine call at once (or after a fixed
delay) with zeros, so a benchmark measures everything but the engine: the scheduler
(`scheduler_overhead`), the HTTP path (`server_overhead`, `sample_polling`, through
`tests/integration/serve_fake.py --executor noop`), worker dispatch (`scaleout`).

Keeps only what the protocol needs to stay consistent (which adapters exist, their configs,
checkpoints that load back); computes nothing. The tests' behavioural fake is
`tests/fakes.py`'s `ToyExecutor`.
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from loraplex.domain.cycle import CycleOutcome, run_cycle_calls
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.model_card import ModelCard
from loraplex.domain.results import (
    AdapterMemory,
    ForwardBackwardResult,
    FwdBwdOutcome,
    LoadResult,
    OptimOutcome,
    OptimStepResult,
    SampleStep,
    SaveResult,
)
from loraplex.domain.sampling import SampledSequence, SampleResult
from loraplex.domain.work import (
    ForwardBackwardWork,
    LoadWork,
    OptimStepWork,
    SampleWork,
    SaveWork,
)
from loraplex.errors import LoraplexError, UserError, user_error

STATE_FILE = "noop_adapter.json"
VOCAB_SIZE = 64


@dataclass(frozen=True)
class NoopCheckpoint:
    """A checkpoint read back: only its LoRA config (the no-op engine has no weights)."""

    config: LoraConfig


@dataclass
class NoopExecutor:
    """Answers at once (or after ``delay_s`` per engine call): zero logprobs, one-token
    samples; checkpoints are one small JSON file holding the adapter's config."""

    delay_s: float = 0.0
    max_context: int = 512
    _adapters: dict[str, LoraConfig] = field(default_factory=dict)

    def model_info(self) -> ModelInfo:
        # The same facts as the tests' toy model, so a server's answers look alike on both.
        card = ModelCard(name="toy", num_layers=1, hidden_size=8, num_heads=1, num_kv_heads=1,
                         head_dim=8, intermediate_size=16, vocab_size=VOCAB_SIZE)
        return ModelInfo(arch="toy", card=card, max_context=self.max_context,
                         eos_token_ids=(1,), num_params=2 * VOCAB_SIZE**2, compute="toy")

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        config.validate(64)
        self._adapters[adapter_id] = config

    def delete_adapter(self, adapter_id: str) -> None:
        self._adapters.pop(adapter_id, None)

    def has_adapter(self, adapter_id: str) -> bool:
        return adapter_id in self._adapters

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        self._wait()
        out: list[FwdBwdOutcome] = []
        for w in works:
            zeros = tuple(array("f", bytes(4 * d.length)) for d in w.data)
            out.append(ForwardBackwardResult(zeros, zeros, {"loss:sum": 0.0}))
        return out

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        self._wait()
        return [OptimStepResult({}) for _ in works]

    def run_cycle(self, fwd_bwd: Sequence[ForwardBackwardWork], optim: Sequence[OptimStepWork]
                  ) -> CycleOutcome:
        return run_cycle_calls(self.forward_backward, self.optim_step, fwd_bwd, optim)

    def save_adapter(self, work: SaveWork) -> SaveResult:
        config = self._config(work.adapter_id)
        if os.path.exists(work.directory):
            raise LoraplexError(f"checkpoint directory {work.directory} exists")
        os.makedirs(work.directory)
        path = os.path.join(work.directory, STATE_FILE)
        with open(path, "w") as f:
            json.dump(asdict(config), f)
        return SaveResult(os.path.getsize(path))

    def read_checkpoint(self, work: LoadWork) -> NoopCheckpoint:
        path = os.path.join(work.directory, STATE_FILE)
        if not os.path.exists(path):
            raise user_error("path", f"no adapter checkpoint in {os.path.basename(work.directory)}")
        with open(path) as f:
            return NoopCheckpoint(LoraConfig(**json.load(f)))

    def install_adapter(self, adapter_id: str, prepared: object) -> LoadResult:
        assert isinstance(prepared, NoopCheckpoint)
        self._adapters[adapter_id] = prepared.config
        return LoadResult(prepared.config)

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        self._adapters[dst_adapter_id] = self._config(src_adapter_id)

    def sample_step(self, admit: Sequence[SampleWork], max_decode_steps: int,
                    cancel: Sequence[str] = ()) -> SampleStep:
        self._wait()
        seq = SampledSequence(array("i", [2]), array("f", [0.0]), "length")
        return SampleStep(tuple((w.request_id, SampleResult(tuple([seq] * w.num_samples)))
                                for w in admit))

    def num_running_samples(self) -> int:
        return 0  # every sample finishes in the step that admits it

    def adapter_memory(self) -> AdapterMemory:
        return AdapterMemory(resident_adapters=len(self._adapters), bytes_resident=0)

    def release_memory(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _config(self, adapter_id: str) -> LoraConfig:
        if adapter_id not in self._adapters:
            raise UserError(f"model_id: adapter {adapter_id!r} is not loaded", field="model_id")
        return self._adapters[adapter_id]

    def _wait(self) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
