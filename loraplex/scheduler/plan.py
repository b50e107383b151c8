"""What one clock step asks the engine to do.

`Scheduler.plan` builds these; `runner.run_plan` executes them; `Scheduler.complete` consumes
the per-item outcomes. A plan names the work items it carries so every outcome finds its future.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.errors import LoraplexError
from loraplex.scheduler.ops import WorkItem


@dataclass(frozen=True)
class CyclePlan:
    """One training clock cycle: a packed batch, then optim steps.

    Attributes:
        batch: forward / forward_backward ops of many models (several consecutive ones of the
            same model allowed) for one engine ``forward_backward`` call, in model-then-seq
            order; pre-failed ops among them resolve with their error without the engine.
        optim: optim steps applied after the batch (one per model), each closing its model's
            ops in the batch or standing alone at its model's head.
    """

    batch: tuple[WorkItem, ...]
    optim: tuple[WorkItem, ...] = ()

    @property
    def items(self) -> tuple[WorkItem, ...]:
        return self.batch + self.optim


@dataclass(frozen=True)
class ControlPlan:
    """One create / load / save / snapshot op (or a pre-failed op that needs no engine)."""

    item: WorkItem


@dataclass(frozen=True)
class SamplePlan:
    """One continuous-batching step: admit new requests, decode every running sequence."""

    admit: tuple[WorkItem, ...]
    max_decode_steps: int


@dataclass(frozen=True)
class ExpirePlan:
    """Ops stuck behind a seq_id that never arrived: each fails with ``error`` (no engine)."""

    items: tuple[WorkItem, ...]
    error: LoraplexError


@dataclass(frozen=True)
class ReleasePlan:
    """Drop adapters nobody can use any more."""

    adapter_ids: tuple[str, ...]


Plan = CyclePlan | ControlPlan | SamplePlan | ExpirePlan | ReleasePlan
