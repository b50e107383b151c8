"""A training cycle is one executor call (`BatchExecutor.run_cycle`): it gives what the two
batch calls give, keeps their failure isolation (one datum, one crashed call, a lost worker),
and the runner makes it once per cycle."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.domain.cycle import CallCrash, CycleOutcome, run_cycle_calls
from loraplex.domain.lora import LoraConfig
from loraplex.domain.ops import CyclePlan
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.errors import ServerError, UserError, WorkerLostError
from loraplex.scheduler.runner import run_plan
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import create, datum, drain, fwd_bwd, make_scheduler, optim

ADAPTERS = ("a:train:0", "b:train:0")


def toy_with_adapters(**kwargs: Any) -> ToyExecutor:
    toy = ToyExecutor(**kwargs)
    for adapter in ADAPTERS:
        toy.create_adapter(adapter, LoraConfig(rank=4))
    return toy


def works(bad: str | None = None) -> tuple[list[ForwardBackwardWork], list[OptimStepWork]]:
    """One forward_backward and one step per adapter (``bad``'s datum is out of vocab)."""
    fwd = [fwd_bwd(a, 1, [datum([2, 3, 99 if a == bad else 5, 7])]).op for a in ADAPTERS]
    steps = [optim(a, 2).op for a in ADAPTERS]
    return fwd, steps  # type: ignore[return-value]


def bits(outcome: object) -> object:
    if isinstance(outcome, ForwardBackwardResult):
        return ([x.tobytes() for x in outcome.logprobs],
                [x.tobytes() for x in outcome.elementwise_loss], dict(outcome.metrics))
    return outcome


def test_one_cycle_call_gives_bitwise_what_the_two_calls_give() -> None:
    two_calls, one_call = toy_with_adapters(), toy_with_adapters()
    fwd, steps = works()
    for _ in range(3):
        expected_fwd = two_calls.forward_backward(fwd)
        expected_steps = two_calls.optim_step(steps)
        cycle = one_call.run_cycle(fwd, steps)
        assert not isinstance(cycle.forward_backward, CallCrash)
        assert [bits(o) for o in cycle.forward_backward] == [bits(o) for o in expected_fwd]
        assert cycle.optim_step == tuple(expected_steps)
    assert [one_call.theta(a) for a in ADAPTERS] == [two_calls.theta(a) for a in ADAPTERS]
    assert one_call.calls[-2:] == [("forward_backward", ADAPTERS), ("optim_step", ADAPTERS)]


def test_a_bad_datum_in_a_cycle_call_fails_only_its_work() -> None:
    toy = toy_with_adapters()
    fwd, steps = works(bad="b:train:0")
    cycle = toy.run_cycle(fwd, steps)
    assert not isinstance(cycle.forward_backward, CallCrash)
    good, bad = cycle.forward_backward
    assert isinstance(good, ForwardBackwardResult) and isinstance(bad, UserError)
    assert not isinstance(cycle.optim_step, CallCrash)
    assert all(isinstance(o, OptimStepResult) for o in cycle.optim_step)
    assert toy.theta("a:train:0") != 0.0


def test_a_crashed_forward_backward_skips_only_the_steps_of_its_adapters() -> None:
    toy = toy_with_adapters(bug_token=13)
    poisoned = fwd_bwd("a:train:0", 1, [datum([13, 2, 3])]).op
    _, steps = works()
    cycle = run_cycle_calls(toy.forward_backward, toy.optim_step, [poisoned], steps)  # type: ignore[list-item]
    assert isinstance(cycle.forward_backward, CallCrash)
    assert not isinstance(cycle.optim_step, CallCrash) and len(cycle.optim_step) == 1
    assert toy.calls[-1] == ("optim_step", ("b:train:0",))
    assert toy.theta("a:train:0") == 0.0


def test_an_empty_part_of_a_cycle_is_not_called() -> None:
    toy = toy_with_adapters()
    fwd, _ = works()
    calls = len(toy.calls)
    assert toy.run_cycle(fwd, []).optim_step == ()
    assert toy.calls[calls:] == [("forward_backward", ADAPTERS)]


class CountingToy(ToyExecutor):
    """Counts `run_cycle` calls; ``lost``: every cycle call finds the worker gone."""

    cycles: int = 0
    lost: bool = False

    def run_cycle(self, fwd_bwd: Any, optim: Any) -> CycleOutcome:
        self.cycles += 1
        if self.lost:
            raise WorkerLostError("engine worker toy was lost (killed)")
        return super().run_cycle(fwd_bwd, optim)


def test_a_cycle_with_forward_backward_and_optim_step_is_one_executor_call(
        stores: Stores) -> None:
    toy = CountingToy()
    s = make_scheduler(toy, stores)
    s.submit(create("a:train:0"))
    drain(s)
    for item in (fwd_bwd("a:train:0", 1), optim("a:train:0", 2)):
        s.submit(item)
    plan = s.plan()
    assert isinstance(plan, CyclePlan) and plan.batch and plan.optim
    outcome = run_plan(toy, plan)
    assert toy.cycles == 1 and outcome.lost is None
    assert outcome.train_s > 0 and outcome.optim_s > 0
    assert outcome.engine_s >= outcome.train_s + outcome.optim_s
    assert isinstance(outcome.outcomes[plan.optim[0].request_id], OptimStepResult)


def test_a_worker_lost_in_a_cycle_call_loses_the_whole_plan(stores: Stores) -> None:
    toy = CountingToy()
    s = make_scheduler(toy, stores)
    s.submit(create("a:train:0"))
    drain(s)
    for item in (fwd_bwd("a:train:0", 1), optim("a:train:0", 2)):
        s.submit(item)
    plan = s.plan()
    assert isinstance(plan, CyclePlan)
    toy.lost = True
    outcome = run_plan(toy, plan)
    assert isinstance(outcome.lost, WorkerLostError) and not outcome.outcomes


def test_a_crash_outside_both_batch_calls_fails_the_cycles_items(stores: Stores) -> None:
    class Broken(ToyExecutor):
        def run_cycle(self, fwd_bwd: Any, optim: Any) -> CycleOutcome:
            raise RuntimeError("the executor itself is broken")

    toy = Broken()
    s = make_scheduler(toy, stores)
    s.submit(create("a:train:0"))
    drain(s)
    for item in (fwd_bwd("a:train:0", 1), optim("a:train:0", 2)):
        s.submit(item)
    plan = s.plan()
    assert isinstance(plan, CyclePlan)
    outcome = run_plan(toy, plan)
    errors = {outcome.outcomes[it.request_id] for it in plan.items}
    assert len(errors) == 1 and isinstance(errors.pop(), ServerError)


@pytest.mark.parametrize("part", ["forward_backward", "optim_step"])
def test_an_executor_answering_the_wrong_number_of_outcomes_fails_that_part(
        stores: Stores, part: str) -> None:
    """(`run_cycle_calls` checks the counts before it steps; the runner checks them again for
    any executor, and reports each step as the executor says it went.)"""
    class Short(ToyExecutor):
        def run_cycle(self, fwd_bwd: Any, optim: Any) -> CycleOutcome:
            cycle = super().run_cycle(fwd_bwd, optim)
            if part == "forward_backward":
                return CycleOutcome((), cycle.optim_step)
            return CycleOutcome(cycle.forward_backward, ())

    toy = Short()
    s = make_scheduler(toy, stores)
    s.submit(create("a:train:0"))
    drain(s)
    fb, step = fwd_bwd("a:train:0", 1), optim("a:train:0", 2)
    for item in (fb, step):
        s.submit(item)
    plan = s.plan()
    assert isinstance(plan, CyclePlan)
    outcome = run_plan(toy, plan)
    failed, other = (fb, step) if part == "forward_backward" else (step, fb)
    assert isinstance(outcome.outcomes[failed.request_id], ServerError)
    assert not isinstance(outcome.outcomes[other.request_id], ServerError)
