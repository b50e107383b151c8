"""What a scheduler hands over when its engine worker is lost: every op it still held (to be
failed with a retryable error) and every live training run (to be restored elsewhere)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from loraplex.domain.ops import (
    ControlPlan,
    CyclePlan,
    ExpirePlan,
    InstallPlan,
    Plan,
    ReleasePlan,
    SamplePlan,
    WorkItem,
)


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


def started_items(plan: Plan | None) -> list[WorkItem]:
    """The items the plan a worker was lost in had started (a sample plan's running
    requests are in the sampling queue, taken from there)."""
    match plan:
        case None | ReleasePlan():
            return []
        case CyclePlan() | ExpirePlan():
            return list(plan.items)
        case ControlPlan():
            return [plan.item]
        case InstallPlan():
            return [i.item for i in plan.installs if i.item is not None]
        case SamplePlan():
            return []  # admitted samples are in the sampling queue's running set
        case _:
            assert_never(plan)
