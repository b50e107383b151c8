"""Results the engine returns, one per work item (or a `LoraplexError` in its place), and the
per-call outcome types of the `BatchExecutor` protocol (defined once, here)."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from loraplex.domain.lora import LoraConfig
from loraplex.domain.sampling import SampleResult, SequenceDelta
from loraplex.errors import LoraplexError


@dataclass(frozen=True)
class ForwardBackwardResult:
    """Per-datum outputs and the metrics of one (forward_)backward op.

    Attributes:
        logprobs: per datum, float32 ``log p(target_i | tokens[:i+1])``.
        elementwise_loss: per datum, float32 per-token loss.
        metrics: ``name:reduction`` keys (``loss:sum`` always present).
        logprobs_trailing_shape: per-position shape of `logprobs` beyond ``[N]``: ``(K,)`` for
            top-K cross-entropy targets ``[N, K]``, ``()`` otherwise.
    """

    logprobs: tuple[array[float], ...]
    elementwise_loss: tuple[array[float], ...]
    metrics: Mapping[str, float]
    logprobs_trailing_shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class OptimStepResult:
    """Metrics of one AdamW step (``name:reduction`` keys)."""

    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SaveResult:
    """Bytes written under the checkpoint directory."""

    size_bytes: int


@dataclass(frozen=True)
class LoadResult:
    """The LoRA config found in the checkpoint."""

    config: LoraConfig


@dataclass(frozen=True)
class AdapterReady:
    """An adapter (a fresh one, or a sampler snapshot) now lives in the engine."""

    adapter_id: str


FwdBwdOutcome = ForwardBackwardResult | LoraplexError
OptimOutcome = OptimStepResult | LoraplexError
SampleOutcome = tuple[str, SampleResult | LoraplexError]
"""``(request_id, outcome)`` of a finished sample request."""


@dataclass(frozen=True)
class SampleStep:
    """What one `sample_step` call returns.

    Attributes:
        finished: the requests that finished (or failed, or were cancelled), in any order.
        progress: new tokens of the streamed requests still running.
    """

    finished: tuple[SampleOutcome, ...] = ()
    progress: tuple[SequenceDelta, ...] = ()


class PreparedAdapter(Protocol):
    """A checkpoint read into memory off the clock thread, waiting to be installed; opaque to
    everyone but the executor that read it."""

    @property
    def config(self) -> LoraConfig: ...


EngineResult = (ForwardBackwardResult | OptimStepResult | SaveResult | LoadResult | SampleResult
                | AdapterReady)
ItemOutcome = EngineResult | LoraplexError
"""What one work item's engine call ended with: a result, or the error that failed it alone."""


@dataclass(frozen=True)
class AdapterMemory:
    """What an engine worker's adapters take (placement and the stats view read it).

    Attributes:
        resident_adapters: adapters whose state is in device memory.
        bytes_resident: their LoRA weights + gradients + AdamW moments, in bytes.
        budget_bytes: the worker's adapter memory budget (None: unbounded).
        paged_adapters: adapters paged out (to host memory or disk).
        bytes_host, bytes_disk: paged-out state kept in host memory / on disk.
        page_outs, page_ins: adapters moved out of / back into device memory so far.
    """

    resident_adapters: int
    bytes_resident: int
    budget_bytes: int | None = None
    paged_adapters: int = 0
    bytes_host: int = 0
    bytes_disk: int = 0
    page_outs: int = 0
    page_ins: int = 0
