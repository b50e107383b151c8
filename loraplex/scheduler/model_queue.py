"""One training model's ops, released strictly in ``seq_id`` order.

Invariants (tinker-api.md §6.2):
- ops start in seq_id order, and only when every earlier op of the model has finished: a model
  has at most one started group of ops (one clock cycle's worth) at a time;
- a group is either one control op (create / load / save / snapshot) or a *run*: consecutive
  forward / forward_backward ops (a client's chunks) optionally closed by the optim_step right
  after them; no weight change can happen inside a run, so its ops may share one engine batch;
- ops may arrive out of order (parallel fwd/bwd chunks arrive 2, 3, 1): they wait until the gap
  before them is filled, or until the gap timeout gives up on the missing seq_id;
- a retried submit of a seq_id already seen returns the original request id (dedupe);
- a create / create-via-load is the model's seq 0, so the client's first op is seq 1.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import assert_never

from loraplex.domain.ops import (
    Admitted,
    CreateModelOp,
    FailedOp,
    LoadOp,
    SampleOp,
    SaveOp,
    SnapshotOp,
    WorkItem,
)
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.errors import user_error

SEEN_MEMORY = 4096
"""How many finished seq_ids a queue remembers for dedupe (older retries are refused)."""
SKIPPED_MEMORY = 64
"""How many skipped seq_id ranges a queue remembers (for the error a late op gets)."""


class ModelQueue:
    """Ops of one model keyed by seq_id.

    Attributes:
        next_seq: the first seq_id not started yet.
        base_model: the served NAME the run was created on (metering).
        frontier_since: clock time ``next_seq`` last moved (gap timing).
    """

    def __init__(self, model_id: str, tenant: str, first_seq: int = 0,
                 base_model: str | None = None, now: float = 0.0,
                 max_ahead: int = 4096) -> None:
        self.model_id = model_id
        self.tenant = tenant
        self.base_model = base_model
        self.next_seq = first_seq
        self.frontier_since = now
        self._num_running = 0
        self._pending: dict[int, WorkItem] = {}
        self._seen: OrderedDict[int, Admitted] = OrderedDict()
        self.max_ahead = max_ahead
        self._skipped: deque[range] = deque(maxlen=SKIPPED_MEMORY)

    @property
    def is_busy(self) -> bool:
        """Ops of this model are in the engine now."""
        return self._num_running > 0

    def admitted_for(self, seq: int) -> Admitted | None:
        """The admission of an already-submitted seq_id (a retried submit), if remembered."""
        return self._seen.get(seq)

    def offer(self, item: WorkItem, admitted: Admitted) -> None:
        """Queue ``item`` at its seq_id.

        Raises:
            UserError: the seq_id was already executed (and is no longer remembered), the gap
                timeout gave up waiting for it, or it is more than ``max_ahead`` past the next
                expected one (nothing is queued then: a far-off id would stall the model).
        """
        seq = item.seq_id
        assert seq is not None, "training ops carry a seq_id"
        if seq > self.next_seq + self.max_ahead:
            raise user_error("seq_id", f"{seq} is more than {self.max_ahead} past the next "
                             f"expected seq_id {self.next_seq} of model {self.model_id!r}")
        if any(seq in skipped for skipped in self._skipped):
            raise user_error("seq_id", f"{seq} of model {self.model_id!r} arrived after the "
                             "gap timeout gave up waiting for it; the ops after it were failed")
        if seq < self.next_seq or seq in self._pending:
            raise user_error("seq_id", f"{seq} already submitted for model {self.model_id!r} "
                             f"(next expected {self.next_seq})")
        self._pending[seq] = item
        self._seen[seq] = admitted
        while len(self._seen) > SEEN_MEMORY:
            self._seen.popitem(last=False)

    def head(self) -> WorkItem | None:
        """The next op, if it has arrived and the model is idle."""
        if self.is_busy:
            return None
        return self._pending.get(self.next_seq)

    def ready_run(self) -> list[WorkItem]:
        """The run at the head (see module docstring); empty when the head is a control op,
        missing, or the model is busy. Pre-failed ops never touch the engine and so never
        end a run."""
        if self.is_busy:
            return []
        run: list[WorkItem] = []
        seq = self.next_seq
        while (item := self._pending.get(seq)) is not None:
            match item.op:
                case OptimStepWork():
                    return [*run, item]
                case ForwardBackwardWork() | FailedOp():
                    run.append(item)
                    seq += 1
                case CreateModelOp() | LoadOp() | SaveOp() | SnapshotOp() | SampleOp():
                    return run
                case _:
                    assert_never(item.op)
        return run

    def start(self, items: list[WorkItem], now: float) -> None:
        """Mark ``items`` (the first ``len(items)`` pending seq_ids, in order) started."""
        for item in items:
            assert item.seq_id == self.next_seq, "ops start in seq order"
            del self._pending[self.next_seq]
            self.next_seq += 1
        self._num_running += len(items)
        self.frontier_since = now

    def finish_one(self) -> None:
        assert self._num_running > 0
        self._num_running -= 1

    def num_waiting(self) -> int:
        return len(self._pending)

    def waiting_items(self) -> list[WorkItem]:
        return list(self._pending.values())

    def take_waiting(self) -> list[WorkItem]:
        """Remove and return every waiting op, in seq order (a lost worker's run)."""
        waiting = [self._pending[s] for s in sorted(self._pending)]
        self._pending.clear()
        return waiting

    def gap(self) -> bool:
        """Ops are waiting but the next seq_id has not arrived."""
        return bool(self._pending) and self.next_seq not in self._pending

    def stuck_since(self) -> float | None:
        """Since when the waiting ops have been blocked by a missing seq_id (None: no gap)."""
        if not self.gap() or self.is_busy:
            return None
        oldest = min(item.enqueued_at for item in self._pending.values())
        return max(self.frontier_since, oldest)

    def give_up_gap(self, now: float) -> list[WorkItem]:
        """Give up on the missing seq_id(s): every waiting op is started (to be failed by the
        caller) and the seq_ids skipped over are refused if they arrive later."""
        stuck = [self._pending[s] for s in sorted(self._pending)]
        last = stuck[-1].seq_id
        assert last is not None
        self._skipped.append(range(self.next_seq, last + 1))  # retries of stuck ids dedupe first
        self._pending.clear()
        self.next_seq = last + 1
        self._num_running += len(stuck)
        self.frontier_since = now
        return stuck
