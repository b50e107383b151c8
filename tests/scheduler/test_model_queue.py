"""Per-model ordering: gaps are waited for, duplicates are recognised, stale ids refused."""

from __future__ import annotations

import pytest

from loraplex.domain.ops import Admitted
from loraplex.errors import UserError
from loraplex.scheduler.model_queue import ModelQueue
from tests.scheduler.work_builders import fwd_bwd


def test_out_of_order_arrivals_are_released_in_seq_order() -> None:
    queue = ModelQueue("m", "alice", first_seq=1)
    items = {seq: fwd_bwd("m", seq) for seq in (1, 2, 3)}
    for seq in (2, 3):
        queue.offer(items[seq], Admitted(items[seq].request_id))
    assert queue.head() is None and queue.gap()
    queue.offer(items[1], Admitted(items[1].request_id))
    released = []
    while (head := queue.head()) is not None:
        queue.start([head], now=0.0)
        assert queue.head() is None, "nothing starts while an op of the model runs"
        queue.finish_one()
        released.append(head.seq_id)
    assert released == [1, 2, 3]


def test_duplicates_and_stale_seq_ids() -> None:
    queue = ModelQueue("m", "alice", first_seq=1)
    item = fwd_bwd("m", 1)
    queue.offer(item, Admitted(item.request_id))
    assert queue.admitted_for(1) == Admitted(item.request_id)
    queue.start([item], now=0.0)
    queue.finish_one()
    assert queue.admitted_for(1) == Admitted(item.request_id), "remembered after it ran"
    with pytest.raises(UserError, match="seq_id"):
        queue.offer(fwd_bwd("m", 1), Admitted("other"))


def test_a_far_future_seq_id_is_refused_and_skipped_ranges_stay_small() -> None:
    q = ModelQueue("m", "alice", first_seq=1, max_ahead=100)
    with pytest.raises(UserError, match="more than 100 past the next expected seq_id 1"):
        q.offer(fwd_bwd("m", 2**63), Admitted("x"))
    assert q.num_waiting() == 0, "nothing was queued"
    q.offer(fwd_bwd("m", 101), Admitted("y"))  # the edge of the window is accepted
    q.give_up_gap(now=1.0)
    assert q.next_seq == 102
    with pytest.raises(UserError, match="gap timeout"):
        q.offer(fwd_bwd("m", 50), Admitted("z"))
    assert list(q._skipped) == [range(1, 102)], "a range, not a set of 101 ids"
