"""Sampling admission under the KV budget (bounded, fair across tenants, never stuck), the
queue state the SDK sees while waiting, and how training and sampling share the engine."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from loraplex.domain.ops import CyclePlan, SamplePlan, WorkItem
from loraplex.scheduler.anticipation import SampleAnticipation
from loraplex.scheduler.engine_share import EngineShare
from loraplex.scheduler.runner import run_plan
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
    sample,
)


def test_admission_is_bounded_by_the_kv_budget_and_fair_across_tenants(
    toy: ToyExecutor, stores: Stores
) -> None:
    # Each request reserves prompt 2 + 2 samples × 3 tokens = 8 KV tokens; the budget holds 2.
    s = make_scheduler(toy, stores, sample_kv_budget_tokens=16, quantum_tokens=8,
                       decode_steps_per_cycle=1)
    alice = [sample([2, 3], max_tokens=3, num_samples=2) for _ in range(5)]
    bob = sample([4, 5], tenant="bob", max_tokens=3, num_samples=2)
    for item in (*alice, bob):
        s.submit(item)
    plan = s.plan()
    assert isinstance(plan, SamplePlan)
    assert sorted(it.tenant for it in plan.admit) == ["alice", "bob"], "bob is not queued behind"
    assert s.queue_state("alice") == "paused_capacity"
    s.complete(plan, run_plan(toy, plan))
    steps = 1
    while (plan := s.plan()) is not None:
        assert s._state.samples.num_reserved <= 16
        assert toy.num_running_samples() + len(plan.admit) <= 2  # type: ignore[union-attr]
        s.complete(plan, run_plan(toy, plan))
        steps += 1
    assert all(s.futures.get(it.request_id, it.tenant).error is None for it in (*alice, bob))
    assert s.queue_state("alice") == "active"
    waits = s.metrics.waits()["sample"]
    assert len(waits) == 6 and max(waits) >= 0


def test_a_request_larger_than_the_budget_runs_alone(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores, sample_kv_budget_tokens=4)
    big = sample([2, 3], max_tokens=8, num_samples=4)
    small = sample([2, 3], max_tokens=1)
    s.submit(big)
    s.submit(small)
    plan = s.plan()
    assert isinstance(plan, SamplePlan) and [it.request_id for it in plan.admit] == [
        big.request_id]
    s.complete(plan, run_plan(toy, plan))
    drain(s)
    assert s.futures.get(small.request_id, "alice").is_done


def test_engine_share_gives_each_class_its_fraction_of_engine_time() -> None:
    share = EngineShare(sample_share=0.25)
    used = {"train": 0.0, "sample": 0.0}
    cost = {"train": 0.8, "sample": 0.03}  # a long cycle vs short decode steps
    for _ in range(2000):
        cls = share.pick(True, True)
        assert cls is not None
        share.charge(cls, cost[cls])
        used[cls] += cost[cls]
    assert abs(used["sample"] / sum(used.values()) - 0.25) < 0.01


def test_an_idle_class_banks_no_credit() -> None:
    share = EngineShare(sample_share=0.5)
    for _ in range(100):
        share.charge(share.pick(True, False) or "train", 1.0)  # sampling idle for 100 s
    picks = []
    for _ in range(4):
        cls = share.pick(True, True)
        assert cls is not None
        share.charge(cls, 1.0)
        picks.append(cls)
    assert picks.count("train") >= 1, f"sampling did not get 100 s of catch-up: {picks}"


def test_training_and_sampling_both_progress_by_engine_time(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores, decode_steps_per_cycle=1, sample_share=0.5)
    s.submit(create("m:train:0"))
    drain(s)
    for seq in range(1, 41, 2):
        s.submit(fwd_bwd("m:train:0", seq, [datum([2, 3, 4, 5])]))
        s.submit(optim("m:train:0", seq + 1))
    for _ in range(40):
        s.submit(sample([2, 3], max_tokens=400))
    fake_s = {CyclePlan: 0.02, SamplePlan: 0.005}  # engine seconds each kind of plan "takes"
    engine = {CyclePlan: 0.0, SamplePlan: 0.0}
    while s._planner.has_training() and s._state.samples.has_work():  # the stretch where both wait
        plan = s.plan()
        assert plan is not None
        outcome = replace(run_plan(toy, plan), engine_s=fake_s[type(plan)])
        s.complete(plan, outcome)
        engine[type(plan)] += fake_s[type(plan)]
    assert engine[CyclePlan] >= 0.1, "several training cycles ran while sampling was busy"
    assert abs(engine[SamplePlan] / sum(engine.values()) - 0.5) < 0.1, engine
    share = s.metrics.share(window_s=1e9)
    assert share["cycle"] > 0 and share["sample"] > 0


def test_a_huge_max_tokens_reserves_no_more_than_the_context_holds(
        toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores, sample_kv_budget_tokens=4 * toy.max_context)
    greedy = sample([2, 3, 4], max_tokens=10**9, num_samples=2)
    small = sample([5, 6], max_tokens=4, tenant="bob")
    s.submit(greedy)
    s.submit(small)
    plan = s.plan()
    assert isinstance(plan, SamplePlan)
    assert {it.request_id for it in plan.admit} == {greedy.request_id, small.request_id}, \
        "clamped to prompt + 2 × (context - prompt), both fit: bob does not wait"


def test_streamed_tokens_reach_the_future_while_it_runs(toy: ToyExecutor, stores: Stores
                                                        ) -> None:
    """A streamed request's plans decode ``stream_decode_steps`` at a time and each one's new
    tokens wait on its future (and wake a progress waiter), joined equal to the result."""
    s = make_scheduler(toy, stores, decode_steps_per_cycle=8, stream_decode_steps=2)
    plain, streamed = sample([2, 3], max_tokens=10), sample([4, 5], max_tokens=10, stream=True)
    s.submit(plain)
    plan = s.plan()
    assert isinstance(plan, SamplePlan) and plan.max_decode_steps == 8
    s.complete(plan, run_plan(toy, plan))
    s.submit(streamed)
    woken: list[int] = []
    s.futures.subscribe(streamed.request_id, lambda: woken.append(1), progress=True)
    tokens: list[int] = []
    while (plan := s.plan()) is not None:
        assert isinstance(plan, SamplePlan) and plan.max_decode_steps == 2
        s.complete(plan, run_plan(toy, plan))
        for delta in s.futures.take_progress(streamed.request_id, "alice"):
            assert delta.start == len(tokens)
            tokens += delta.tokens
    assert s.futures.take_progress(streamed.request_id, "bob") == []
    entry = s.futures.get(streamed.request_id, "alice")
    assert entry.is_done and entry.error is None
    final = list(entry.result.result.sequences[0].tokens)  # type: ignore[union-attr]
    assert 0 < len(tokens) < len(final) and tokens == final[:len(tokens)]
    assert len(woken) >= 2


def test_cancelled_samples_leave_the_queue_and_the_engine(toy: ToyExecutor, stores: Stores
                                                          ) -> None:
    s = make_scheduler(toy, stores, sample_kv_budget_tokens=12, decode_steps_per_cycle=1)
    running, waiting = sample([2, 3], max_tokens=10, stream=True), sample([4, 5], max_tokens=9)
    s.submit(running)
    s.submit(waiting)  # 12 + 11 KV tokens: it waits behind the first
    plan = s.plan()
    assert isinstance(plan, SamplePlan) and [it.request_id for it in plan.admit] == [
        running.request_id]
    s.complete(plan, run_plan(toy, plan))
    assert s.cancel_sample(waiting.request_id) and s.cancel_sample(running.request_id)
    assert not s.cancel_sample("nobody")
    gone = s.futures.get(waiting.request_id, "alice")
    assert gone.is_done and gone.error is not None and "cancelled" in gone.error.message
    plan = s.plan()
    assert isinstance(plan, SamplePlan) and plan.cancel == (running.request_id,)
    s.complete(plan, run_plan(toy, plan))
    entry = s.futures.get(running.request_id, "alice")
    assert entry.is_done and entry.error is not None and "cancelled" in entry.error.message
    assert toy.num_running_samples() == 0 and s.plan() is None
    assert s._state.samples.num_reserved == 0 and s._state.inflight["alice"] == 0


def test_a_burst_of_long_prompts_is_admitted_over_steps_and_a_short_one_goes_first(
        toy: ToyExecutor, stores: Stores) -> None:
    """At most ``sample_prefill_tokens_per_step`` prompt tokens are admitted per step (the
    first request always): another tenant's short request is admitted in the first step, not
    after every long prompt queued before it has been prefilled. A prompt admitted before
    (prefix-cached in the engine) costs nothing."""
    s = make_scheduler(toy, stores, sample_prefill_tokens_per_step=400, quantum_tokens=64)
    heavy = [sample([2 + i] * 300, max_tokens=4) for i in range(4)]
    short = sample([3, 4], tenant="bob", max_tokens=2)
    for item in (*heavy, short):
        s.submit(item)
    admitted: list[list[str]] = []
    while (plan := s.plan()) is not None:
        assert isinstance(plan, SamplePlan)
        admitted.append([it.request_id for it in plan.admit])
        assert sum(len(it.op.work.prompt) for it in plan.admit) <= 400 or \
            len(plan.admit) == 1  # type: ignore[union-attr]
        s.complete(plan, run_plan(toy, plan))
    first = admitted[0]
    assert short.request_id in first and len(first) == 2
    assert [rid for step in admitted for rid in step if rid != short.request_id] == [
        it.request_id for it in heavy], "one long prompt per step, in order"
    again = [sample([2 + i] * 300, max_tokens=4) for i in range(4)]
    for item in again:
        s.submit(item)
    plan = s.plan()
    assert isinstance(plan, SamplePlan) and len(plan.admit) == 4, "cached prompts cost none"


def test_a_tenant_keeps_room_for_others_while_they_sample(toy: ToyExecutor, stores: Stores
                                                          ) -> None:
    """Alone, a tenant may reserve the whole budget; while another tenant sampled within the
    window it reserves at most ``sample_max_tenant_share`` of it (plus one request), so the
    other's next requests are admitted at the next step, not after its requests finish."""
    clock = FakeClock()
    # each request reserves 2 + 18 = 20 KV tokens; the budget holds 10 of them
    s = make_scheduler(toy, stores, clock, sample_kv_budget_tokens=200,
                       sample_max_tenant_share=0.5, latency_fair_window_s=2.0,
                       decode_steps_per_cycle=1)

    def alice_holds() -> int:
        return sum(s._state.samples._reserved[rid] for rid in s._state.samples.running_ids()
                   if s._state.samples._running[rid].tenant == "alice")

    def step() -> list[WorkItem]:
        before = alice_holds()
        plan = s.plan()
        assert isinstance(plan, SamplePlan)
        s.complete(plan, run_plan(toy, plan))
        clock.now += 0.1
        if s._state.samples.num_waiting("bob") or any(it.tenant == "bob" for it in plan.admit):
            gained = [it for it in plan.admit if it.tenant == "alice"]
            assert not gained or before < 100, "alice takes more only under her share"
        return list(plan.admit)

    for _ in range(10):
        s.submit(sample([2, 3], max_tokens=18))
    assert len(step()) == 10, "no cap while alone"
    s.submit(sample([4, 5], tenant="bob", max_tokens=18))
    for _ in range(20):
        s.submit(sample([2, 3], max_tokens=18))
    while not any(it.tenant == "bob" for it in step()):  # the first waits for room
        pass
    for _ in range(3):
        later = sample([4, 5], tenant="bob", max_tokens=18)
        s.submit(later)
        assert later.request_id in [it.request_id for it in step()], "room is kept for bob"
    while s._state.samples.has_work():
        step()


def _cycle_then_sample(s, toy: ToyExecutor, cycle_s: float) -> None:  # type: ignore[no-untyped-def]
    """A training run with ops left queued; one cycle of ``cycle_s`` engine seconds, then a
    one-token sample that finishes in the next sampling step."""
    s.submit(create("m:train:0"))
    drain(s)
    for seq in range(1, 21, 2):
        s.submit(fwd_bwd("m:train:0", seq, [datum([2, 3, 4, 5])]))
        s.submit(optim("m:train:0", seq + 1))
    plan = s.plan()
    assert isinstance(plan, CyclePlan)
    s.complete(plan, replace(run_plan(toy, plan), engine_s=cycle_s))
    s.submit(sample([2, 3], max_tokens=1))
    plan = s.plan()
    assert isinstance(plan, SamplePlan)
    s.complete(plan, run_plan(toy, plan))
    assert toy.num_running_samples() == 0


def test_training_waits_briefly_for_the_next_request_of_a_finished_samples_client(
        toy: ToyExecutor, stores: Stores) -> None:
    """A sequential sampler beside a training flood: its next request, sent just after the
    last finished, is admitted before the next cycle (on main it waited a whole cycle)."""
    s = make_scheduler(toy, stores, sample_anticipation_s=0.2,
                       sample_anticipation_cycle_fraction=0.1)
    _cycle_then_sample(s, toy, cycle_s=1.0)
    assert s.plan() is None, "training holds for the sampler's next request"
    s.submit(sample([4, 5], max_tokens=1))
    assert isinstance(s.plan(), SamplePlan), "the request came back within the hold"


def test_the_hold_is_bounded_and_runs_out(toy: ToyExecutor, stores: Stores) -> None:
    """A client that does not come back costs training at most the hold: ``min(cap,
    fraction × mean cycle)`` (here min(1, 0.05 × 1 s)), and then the cycle starts."""
    s = make_scheduler(toy, stores, sample_anticipation_s=1.0,
                       sample_anticipation_cycle_fraction=0.05)
    _cycle_then_sample(s, toy, cycle_s=1.0)
    began = time.monotonic()
    plan = s.wait_for_plan(timeout=5.0)
    while plan is None and time.monotonic() - began < 5.0:
        plan = s.wait_for_plan(timeout=5.0)
    waited = time.monotonic() - began
    assert isinstance(plan, CyclePlan)
    assert 0.03 <= waited < 1.0, f"held {waited:.3f} s for a 0.05 s hold"


def test_no_hold_when_anticipation_is_off(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores, sample_anticipation_s=0.0)
    _cycle_then_sample(s, toy, cycle_s=1.0)
    assert isinstance(s.plan(), CyclePlan)


def test_the_hold_is_charged_to_sampling() -> None:
    """Training's wait for a sampler counts as sampling's engine time, so a client that
    always comes back gets ``sample_share`` and no more."""
    hold = SampleAnticipation(cap_s=0.1, cycle_fraction=0.5)
    hold.cycle_done(1.0)
    hold.samples_finished(now=100.0)
    assert hold.remaining(now=100.02) == pytest.approx(0.08)
    assert hold.end(now=100.03) == 0.0, "training never waited on it: nothing to charge"
    hold.samples_finished(now=200.0)
    hold.hold()
    assert hold.end(now=200.5) == pytest.approx(0.1), "at most the hold is charged"
    assert hold.remaining(now=200.6) == 0.0
