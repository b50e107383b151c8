"""The one interface between scheduling and compute: `BatchExecutor`.

Defined here, by its consumer. Implemented by `loraplex.engine.executor.Engine` (torch) and by
test fakes. Every batch method returns one outcome per work item, in order: a result, or the
`LoraplexError` that failed that item alone. Whole-batch exceptions are reserved for bugs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.results import (
    ForwardBackwardResult,
    LoadResult,
    OptimStepResult,
    SaveResult,
)
from loraplex.domain.sampling import SampleResult
from loraplex.domain.work import ForwardBackwardWork, LoadWork, OptimStepWork, SampleWork, SaveWork
from loraplex.errors import LoraplexError

FwdBwdOutcome = ForwardBackwardResult | LoraplexError
OptimOutcome = OptimStepResult | LoraplexError
SampleOutcome = tuple[str, SampleResult | LoraplexError]


class BatchExecutor(Protocol):
    """Compute for one base model and the adapters living beside it."""

    def model_info(self) -> ModelInfo:
        """Static facts about the base model."""
        ...

    def create_adapter(self, adapter_id: str, config: LoraConfig) -> None:
        """Add a fresh adapter (B = 0). Raises UserError for a bad config."""
        ...

    def delete_adapter(self, adapter_id: str) -> None:
        """Drop an adapter and its optimizer state; unknown ids are ignored."""
        ...

    def has_adapter(self, adapter_id: str) -> bool:
        """Whether the adapter is resident."""
        ...

    def forward_backward(self, works: Sequence[ForwardBackwardWork]) -> list[FwdBwdOutcome]:
        """Run many models' forward / forward_backward ops as one packed batch.

        Gradients accumulate into each adapter until its next `optim_step`. Several works may
        name the same adapter (consecutive chunks of one client call, or a forward next to a
        forward_backward): each is its own outcome, all see the same weights, and the
        gradients of all of them accumulate.
        """
        ...

    def optim_step(self, works: Sequence[OptimStepWork]) -> list[OptimOutcome]:
        """One AdamW step per listed adapter; clears their gradients."""
        ...

    def save_adapter(self, work: SaveWork) -> SaveResult:
        """Write weights (and optimizer state) atomically under ``work.directory``."""
        ...

    def load_adapter(self, work: LoadWork) -> LoadResult:
        """Load a checkpoint into ``work.adapter_id`` (creating it if needed)."""
        ...

    def snapshot_adapter(self, src_adapter_id: str, dst_adapter_id: str) -> None:
        """Freeze a copy of ``src``'s current weights under ``dst`` (a sampler version)."""
        ...

    def sample_step(
        self, admit: Sequence[SampleWork], max_decode_steps: int
    ) -> list[SampleOutcome]:
        """Continuous batching: admit new requests (prefill), decode up to ``max_decode_steps``
        steps for every running sequence, and return the requests that finished (with their
        request ids), in any order. Requests that stay unfinished keep running next call."""
        ...

    def num_running_samples(self) -> int:
        """Requests admitted by `sample_step` and not yet returned."""
        ...
