"""Ops stuck behind a seq_id that never arrives (the gap timeout), and failure isolation inside
one clock cycle (a bad chunk, a crashed batch call)."""

from __future__ import annotations

import pytest

from loraplex.domain.ops import ExpirePlan
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.errors import ServerError, UserError
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import (
    FakeClock,
    create,
    datum,
    drain,
    fwd_bwd,
    make_scheduler,
    optim,
    step,
)


def outcome(s, item):  # type: ignore[no-untyped-def]
    entry = s.futures.get(item.request_id, item.tenant)
    assert entry.is_done, f"{item.kind} still pending"
    if entry.error is not None:
        raise entry.error
    return entry.result


def test_ops_stuck_behind_a_missing_seq_id_fail_after_the_gap_timeout(
    toy: ToyExecutor, stores: Stores
) -> None:
    clock = FakeClock()
    s = make_scheduler(toy, stores, clock=clock, seq_gap_timeout_s=600)
    s.submit(create("m:train:0"))
    drain(s)
    stuck = [fwd_bwd("m:train:0", 2), optim("m:train:0", 3)]
    for item in stuck:
        s.submit(item)
    clock.now += 599
    assert s.plan() is None, "still within the timeout: keep waiting for seq 1"
    clock.now += 2
    plan = step(s)
    assert isinstance(plan, ExpirePlan)
    for item in stuck:
        with pytest.raises(UserError, match=r"seq_id 1 .* never arrived within 600 s"):
            outcome(s, item)
    with pytest.raises(UserError, match="after the gap timeout"):
        s.submit(fwd_bwd("m:train:0", 1))
    later = fwd_bwd("m:train:0", 4)
    s.submit(later)
    drain(s)
    assert isinstance(outcome(s, later), ForwardBackwardResult), "the model goes on"
    assert s.metrics.calls["expire"] == 1


def test_the_gap_clock_starts_when_the_queue_gets_stuck_not_at_submit(
    toy: ToyExecutor, stores: Stores
) -> None:
    clock = FakeClock()
    s = make_scheduler(toy, stores, clock=clock, seq_gap_timeout_s=600)
    s.submit(create("m:train:0"))
    drain(s)
    s.submit(fwd_bwd("m:train:0", 3))
    clock.now += 500
    s.submit(fwd_bwd("m:train:0", 1))
    drain(s)  # seq 1 ran at t=500: the queue now waits for seq 2 from there
    clock.now += 400
    assert s.plan() is None


def test_no_gap_timeout_when_disabled(toy: ToyExecutor, stores: Stores) -> None:
    clock = FakeClock()
    s = make_scheduler(toy, stores, clock=clock, seq_gap_timeout_s=None)
    s.submit(create("m:train:0"))
    drain(s)
    s.submit(fwd_bwd("m:train:0", 2))
    clock.now += 1e6
    assert s.plan() is None


def test_a_bad_chunk_fails_alone_and_the_step_still_applies_the_good_ones(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores)
    s.submit(create("m:train:0"))
    s.submit(create("n:train:0", tenant="bob"))
    drain(s)
    good = fwd_bwd("m:train:0", 1)
    bad = fwd_bwd("m:train:0", 2, loss_fn="no_such_loss")
    step_op = optim("m:train:0", 3)
    neighbour = fwd_bwd("n:train:0", 1, tenant="bob")
    for item in (good, bad, step_op, neighbour):
        s.submit(item)
    assert drain(s) == 1, "all of it in one cycle"
    with pytest.raises(UserError, match="loss"):
        outcome(s, bad)
    assert isinstance(outcome(s, good), ForwardBackwardResult)
    assert isinstance(outcome(s, neighbour), ForwardBackwardResult)
    assert isinstance(outcome(s, step_op), OptimStepResult)
    assert toy.theta("m:train:0") != 0.0


def test_a_crashed_batch_call_does_not_step_its_models_but_others_step(stores: Stores) -> None:
    toy = ToyExecutor(bug_token=13)
    s = make_scheduler(toy, stores)
    s.submit(create("a:train:0"))
    s.submit(create("b:train:0", tenant="bob"))
    drain(s)
    s.submit(fwd_bwd("b:train:0", 1, tenant="bob"))
    drain(s)  # bob's gradients are in; his optim_step will stand alone at his head
    poisoned = fwd_bwd("a:train:0", 1, [datum([13, 2, 3])])
    a_step = optim("a:train:0", 2)
    b_step = optim("b:train:0", 2, tenant="bob")
    for item in (poisoned, a_step, b_step):
        s.submit(item)
    assert drain(s) == 1
    for item in (poisoned, a_step):
        with pytest.raises(ServerError, match=r"error id [0-9a-f]{12}"):
            outcome(s, item)
    assert isinstance(outcome(s, b_step), OptimStepResult)
    assert toy.theta("a:train:0") == 0.0 and toy.theta("b:train:0") != 0.0
