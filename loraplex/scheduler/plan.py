"""What one clock step asks the engine to do: exactly one engine entry point per plan.

`Scheduler.plan` builds these; `runner.run_plan` executes them; `Scheduler.complete` consumes
the per-item outcomes. A plan names the work items it carries so every outcome finds its future.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.scheduler.ops import WorkItem


@dataclass(frozen=True)
class TrainPlan:
    """forward / forward_backward ops of several models packed into one engine batch."""

    items: tuple[WorkItem, ...]


@dataclass(frozen=True)
class OptimPlan:
    """optim_steps of several models applied in one engine call."""

    items: tuple[WorkItem, ...]


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
class ReleasePlan:
    """Drop adapters nobody can use any more."""

    adapter_ids: tuple[str, ...]


Plan = TrainPlan | OptimPlan | ControlPlan | SamplePlan | ReleasePlan
