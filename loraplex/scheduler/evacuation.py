"""What a scheduler hands over when its engine worker is lost: every op it still held (to be
failed with a retryable error) and every live training run (to be restored elsewhere)."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.domain.ops import WorkItem


@dataclass(frozen=True)
class EvacuatedRun:
    """A live training run of a lost worker.

    Attributes:
        next_seq: the first seq_id its client has not used yet (every op it sent before
            either finished or fails now).
        base_model: the served NAME it trains on.
    """

    model_id: str
    tenant: str
    base_model: str | None
    next_seq: int


@dataclass(frozen=True)
class Evacuation:
    """Ops to fail (with their base model, for metering) and runs to restore."""

    items: tuple[tuple[WorkItem, str | None], ...]
    runs: tuple[EvacuatedRun, ...]
