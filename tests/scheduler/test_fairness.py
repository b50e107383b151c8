"""Deficit round-robin alone (hand-checked selections, long-run token shares) and inside the
scheduler (a deep queue does not starve a one-op tenant)."""

from __future__ import annotations

from collections import Counter

from loraplex.domain.ops import CyclePlan
from loraplex.scheduler.fairness import DeficitRoundRobin
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import create, datum, drain, fwd_bwd, make_scheduler, step


def ops(tenant: str, sizes: list[int]):  # type: ignore[no-untyped-def]
    return [fwd_bwd(f"{tenant}:train:{i}", 1, [datum(list(range(2, 2 + n)))], tenant=tenant)
            for i, n in enumerate(sizes)]


def test_each_round_grants_a_quantum_and_credit_carries_over() -> None:
    drr = DeficitRoundRobin(quantum=10)
    alice = ops("alice", [30, 30])
    bob = ops("bob", [4, 4, 4])
    chosen = drr.select({"alice": alice, "bob": bob}, budget=40)
    # Round 1: alice 10 (< 30), bob takes 4+4 (credit 10). Round 2: alice 20, bob takes 4
    # and empties. Round 3: alice 30 ≥ 30 but 12 + 30 > 40: the batch is full.
    assert [it.tenant for it in chosen] == ["bob", "bob", "bob"]
    chosen = drr.select({"alice": alice}, budget=40)
    assert chosen == [alice[0]], "alice's credit carried over: she is served at once"


def test_a_lone_tenant_fills_the_budget() -> None:
    drr = DeficitRoundRobin(quantum=10)
    alice = ops("alice", [30, 30, 30, 30])
    assert len(drr.select({"alice": alice}, budget=100)) == 3


def test_an_op_larger_than_the_budget_runs_alone_or_waits_when_told() -> None:
    drr = DeficitRoundRobin(quantum=10)
    huge = ops("alice", [500])
    assert drr.select({"alice": huge}, budget=100) == huge
    assert DeficitRoundRobin(10).select({"alice": huge}, 100, allow_oversize=False) == []


def test_backlogged_tenants_get_equal_token_shares_whatever_their_op_sizes() -> None:
    drr = DeficitRoundRobin(quantum=64)
    queues = {"small": ops("small", [8] * 4000), "mid": ops("mid", [50] * 800),
              "big": ops("big", [300] * 160)}
    served: Counter[str] = Counter()
    for _ in range(60):
        for item in drr.select(queues, budget=1024):
            served[item.tenant] += item.num_tokens
            queues[item.tenant].remove(item)
    total = sum(served.values())
    for tenant in queues:
        assert abs(served[tenant] / total - 1 / 3) < 0.03, served


def test_a_deep_queue_does_not_delay_a_one_op_tenant_past_the_next_cycle(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores, token_budget=200, quantum_tokens=50)
    for i in range(10):
        s.submit(create(f"a{i}:train:0", tenant="alice"))
    s.submit(create("b:train:0", tenant="bob"))
    drain(s)
    for i in range(10):  # 50 queued ops: 5 chunks of 30 tokens on each of 10 models
        for seq in range(1, 6):
            s.submit(fwd_bwd(f"a{i}:train:0", seq, [datum(list(range(2, 32)))], tenant="alice"))
    bob = fwd_bwd("b:train:0", 1, [datum([2, 3, 4, 5])], tenant="bob")
    s.submit(bob)
    plan = step(s)
    assert isinstance(plan, CyclePlan) and bob.request_id in {it.request_id for it in plan.batch}
    assert sum(it.num_tokens for it in plan.batch) <= 200
    assert drain(s) >= 50 * 30 // 200, "alice's backlog still runs, a budget at a time"


def test_a_cap_ends_a_tenants_share_and_keeps_its_credit() -> None:
    drr = DeficitRoundRobin(quantum=100)
    alice = ops("alice", [30, 30, 30, 30])
    chosen = drr.select({"alice": alice, "bob": ops("bob", [10])}, budget=1000,
                        caps={"alice": 50})
    assert Counter(it.tenant for it in chosen) == {"alice": 2, "bob": 1}, "30 + 30 ≥ 50"


def test_a_flooding_tenant_does_not_lengthen_a_light_tenants_cycles(
    toy: ToyExecutor, stores: Stores
) -> None:
    """While bob trains small steps, alice's flood is packed at about his size per cycle
    (floor 16 here); once bob has been idle past the window she fills the budget again."""
    from tests.scheduler.work_builders import FakeClock

    clock = FakeClock()
    s = make_scheduler(toy, stores, clock=clock, token_budget=4096, latency_fair_floor_tokens=16,
                       latency_fair_window_s=2.0)
    s.submit(create("a:train:0"))
    s.submit(create("b:train:0", tenant="bob"))
    drain(s)
    for seq in range(1, 41):  # alice: 40 ready ops of 10 tokens each
        s.submit(fwd_bwd("a:train:0", seq, [datum(list(range(2, 12)))]))
    s.submit(fwd_bwd("b:train:0", 1, [datum([2, 3, 4, 5, 6, 7, 8, 9])], tenant="bob"))
    plan = step(s)
    assert isinstance(plan, CyclePlan)
    assert Counter(it.tenant for it in plan.batch) == {"bob": 1, "alice": 2}, "16 ≥ bob's 8"
    clock.now += 1.0  # bob was active a second ago: alice stays capped
    plan = step(s)
    assert isinstance(plan, CyclePlan) and len(plan.batch) == 2
    clock.now += 5.0  # bob idle past the window: alice alone fills the cycle
    plan = step(s)
    assert isinstance(plan, CyclePlan) and len(plan.batch) == 36
