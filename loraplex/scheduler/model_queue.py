"""One training model's ops, released strictly in ``seq_id`` order.

Invariants (tinker-api.md §6.2):
- op N+1 of a model never starts before op N has finished (one op of a model in flight);
- ops may arrive out of order (parallel fwd/bwd chunks arrive 2, 3, 1): they wait in ``pending``
  until the gap before them is filled;
- a retried submit of a seq_id already seen returns the original request id (dedupe);
- a create / create-via-load is the model's seq 0, so the client's first op is seq 1.
"""

from __future__ import annotations

from collections import OrderedDict

from loraplex.errors import user_error
from loraplex.scheduler.ops import Admitted, WorkItem

SEEN_MEMORY = 4096
"""How many finished seq_ids a queue remembers for dedupe (older retries are refused)."""


class ModelQueue:
    """Ops of one model keyed by seq_id.

    Attributes:
        next_seq: the seq_id that runs next.
        is_busy: an op of this model is in the engine now.
    """

    def __init__(self, model_id: str, tenant: str, first_seq: int = 0) -> None:
        self.model_id = model_id
        self.tenant = tenant
        self.next_seq = first_seq
        self.is_busy = False
        self._pending: dict[int, WorkItem] = {}
        self._seen: OrderedDict[int, Admitted] = OrderedDict()

    def admitted_for(self, seq: int) -> Admitted | None:
        """The admission of an already-submitted seq_id (a retried submit), if remembered."""
        return self._seen.get(seq)

    def offer(self, item: WorkItem, admitted: Admitted) -> None:
        """Queue ``item`` at its seq_id.

        Raises:
            UserError: the seq_id was already executed and is no longer remembered.
        """
        seq = item.seq_id
        assert seq is not None, "training ops carry a seq_id"
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

    def start_head(self) -> WorkItem:
        item = self._pending.pop(self.next_seq)
        self.is_busy = True
        return item

    def finish_head(self) -> None:
        self.is_busy = False
        self.next_seq += 1

    def num_waiting(self) -> int:
        return len(self._pending)

    def waiting_items(self) -> list[WorkItem]:
        return list(self._pending.values())

    def gap(self) -> bool:
        """Ops are waiting but the next seq_id has not arrived."""
        return bool(self._pending) and self.next_seq not in self._pending
