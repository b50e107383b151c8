"""What a scheduler hands over when its engine worker is lost: every op it still held (to be
failed with a retryable error) and every live training run (to be restored elsewhere), and
`evacuate`, which takes them out of its `SchedulerState`."""

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
from loraplex.scheduler.residency import sample_op
from loraplex.scheduler.scheduler_state import SchedulerState


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


def evacuate(state: SchedulerState, lost_plan: Plan | None) -> Evacuation:
    """Take every op ``state`` holds (``lost_plan``'s, saves and reads the worker died under,
    loads read but not installed, waiting training ops, waiting and running samples) and its
    live runs; nothing is left to run there. Runs under the state's lock."""
    state.evacuated = True
    read = [i.item for i in state.installs if i.item is not None]  # loads read
    state.installs = []
    items = [(it, state.queues[it.model_id].base_model if it.model_id else None)
             for it in (*started_items(lost_plan), *state.lost_io, *read)]
    runs = []
    for model_id, queue in state.queues.items():
        waiting = queue.take_waiting()
        items += [(it, queue.base_model) for it in waiting]
        last = max((it.seq_id or 0 for it in waiting), default=queue.next_seq - 1)
        if model_id not in state.closing:
            runs.append(EvacuatedRun(model_id, queue.tenant, queue.base_model,
                                     max(last + 1, queue.next_seq)))
        state.closing.add(model_id)
    items += [(it, sample_op(it).base_model) for it in state.samples.take_all()]
    for item, _ in items:
        state.op_done(item.tenant)
    return Evacuation(tuple(items), tuple(runs))
