"""Results the engine returns, one per work item (or a `LoraplexError` in its place)."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field

from loraplex.domain.lora import LoraConfig


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

    logprobs: tuple[array, ...]
    elementwise_loss: tuple[array, ...]
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
