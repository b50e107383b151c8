"""The scheduler state machine with the toy executor, driven synchronously (milliseconds)."""

from __future__ import annotations

import pytest

from loraplex.domain.ops import CyclePlan, FailedOp, ModelCreated, Sampled, SamplePlan, WorkItem
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.errors import CapacityError, NotFoundError, ServerError, UserError, user_error
from loraplex.scheduler.runner import run_plan
from loraplex.store.stores import Stores
from tests.fakes import ToyExecutor
from tests.scheduler.work_builders import (
    create,
    datum,
    drain,
    fwd_bwd,
    make_scheduler,
    optim,
    rid,
    sample,
)


def result(scheduler, item: WorkItem):  # type: ignore[no-untyped-def]
    entry = scheduler.futures.get(item.request_id, item.tenant)
    assert entry.is_done, f"{item.kind} {item.request_id} still pending"
    if entry.error is not None:
        raise entry.error
    return entry.result


def test_create_model_resolves_and_records_the_run(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    item = create("s1:train:0")
    s.submit(item)
    drain(s)
    assert result(s, item) == ModelCreated("s1:train:0")
    assert stores.runs.get("s1:train:0", "alice").run.lora.rank == 4
    assert toy.has_adapter("s1:train:0")


def test_a_failed_create_leaves_no_live_model(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    item = create("m:train:0", rank=10_000)
    s.submit(item)
    drain(s)
    with pytest.raises(UserError, match="rank"):
        result(s, item)
    assert not s.has_model("m:train:0") and stores.runs.find("m:train:0") is None


def test_chunks_arriving_2_3_1_run_in_seq_order(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores, timeslice=True)
    s.submit(create("m:train:0"))
    drain(s)
    chunks = [fwd_bwd("m:train:0", seq) for seq in (1, 2, 3)]
    s.submit(chunks[1])
    s.submit(chunks[2])
    assert drain(s) == 0, "nothing may run while seq 1 is missing"
    s.submit(chunks[0])
    order = []
    while (plan := s.plan()) is not None:
        assert isinstance(plan, CyclePlan)
        order += [it.seq_id for it in plan.items]
        s.complete(plan, run_plan(toy, plan))
    assert order == [1, 2, 3]


def test_optim_step_waits_for_pending_forward_backward(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    s.submit(create("m:train:0"))
    drain(s)
    step = optim("m:train:0", 2)
    s.submit(step)
    drain(s)
    assert not s.futures.get(step.request_id, "alice").is_done
    fb = fwd_bwd("m:train:0", 1)
    s.submit(fb)
    drain(s)
    assert isinstance(result(s, fb), ForwardBackwardResult)
    assert isinstance(result(s, step), OptimStepResult)
    assert toy.theta("m:train:0") != 0.0, "the step applied the accumulated gradient"
    assert stores.runs.get("m:train:0", "alice").num_steps == 1
    assert stores.runs.get("m:train:0", "alice").num_trained_tokens == 4


def test_retried_submit_returns_the_original_request_id(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    first = create("m:train:0")
    assert s.submit(first).request_id == first.request_id
    retry = create("m:train:0")
    assert s.submit(retry).request_id == first.request_id
    drain(s)
    fb = fwd_bwd("m:train:0", 1)
    s.submit(fb)
    assert s.submit(fwd_bwd("m:train:0", 1)).request_id == fb.request_id
    drain(s)
    assert s.submit(fwd_bwd("m:train:0", 1)).request_id == fb.request_id, "after it ran, too"
    assert len([c for c in toy.calls if c[0] == "forward_backward"]) == 1
    a = sample([2, 3], key=("sess:sample:0", 5))
    admitted = s.submit(a, ("x:0",))
    again = s.submit(sample([2, 3], key=("sess:sample:0", 5)), ("y:0",))
    assert again == admitted


def test_forward_backward_of_several_models_packed_in_one_call(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores)
    for i, tenant in enumerate(["alice", "bob", "carol"]):
        s.submit(create(f"m{i}:train:0", tenant=tenant))
    drain(s)
    toy.calls.clear()
    items = [fwd_bwd(f"m{i}:train:0", 1, tenant=t) for i, t in enumerate(["alice", "bob", "carol"])]
    items += [optim(f"m{i}:train:0", 2, tenant=t) for i, t in enumerate(["alice", "bob", "carol"])]
    for item in items:
        s.submit(item)
    drain(s)
    assert toy.calls == [
        ("forward_backward", ("m0:train:0", "m1:train:0", "m2:train:0")),
        ("optim_step", ("m0:train:0", "m1:train:0", "m2:train:0")),
    ]
    cycles = [c for c in s.metrics.recent() if c.kind == "cycle"]
    assert cycles[-1].tenants == ("alice", "bob", "carol")


def test_user_error_fails_only_its_own_future(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    s.submit(create("good:train:0"))
    s.submit(create("bad:train:0", tenant="bob"))
    drain(s)
    good = fwd_bwd("good:train:0", 1)
    bad = fwd_bwd("bad:train:0", 1, tenant="bob", loss_fn="no_such_loss")
    s.submit(good)
    s.submit(bad)
    drain(s)
    assert isinstance(result(s, good), ForwardBackwardResult)
    with pytest.raises(UserError, match="loss_fn"):
        result(s, bad)
    after = fwd_bwd("bad:train:0", 2, tenant="bob")
    s.submit(after)
    drain(s)
    assert isinstance(result(s, after), ForwardBackwardResult), "the same client continues"


def test_engine_bug_fails_the_batch_with_an_error_id_and_scheduling_continues(
    stores: Stores,
) -> None:
    toy = ToyExecutor(bug_token=13)
    s = make_scheduler(toy, stores)
    s.submit(create("a:train:0"))
    s.submit(create("b:train:0", tenant="bob"))
    drain(s)
    poisoned = fwd_bwd("a:train:0", 1, [datum([13, 2, 3])])
    neighbour = fwd_bwd("b:train:0", 1, tenant="bob")
    s.submit(poisoned)
    s.submit(neighbour)
    drain(s)
    for item in (poisoned, neighbour):
        with pytest.raises(ServerError, match=r"error id [0-9a-f]{12}") as info:
            result(s, item)
        assert "Traceback" not in str(info.value) and "toy engine bug" not in str(info.value)
    later = fwd_bwd("b:train:0", 2, tenant="bob")
    s.submit(later)
    drain(s)
    assert isinstance(result(s, later), ForwardBackwardResult)


def test_a_failed_op_keeps_its_seq_slot(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    s.submit(create("m:train:0"))
    drain(s)
    rejected = WorkItem(rid(), "alice", "ForwardBackward",
                        FailedOp(user_error("data[0].model_input", "token 999 out of vocab")),
                        model_id="m:train:0", seq_id=1)
    step = optim("m:train:0", 2)
    s.submit(step)
    s.submit(rejected)
    drain(s)
    with pytest.raises(UserError, match=r"data\[0\]\.model_input"):
        result(s, rejected)
    assert isinstance(result(s, step), OptimStepResult)


def test_unknown_or_foreign_model_is_not_found(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    s.submit(create("m:train:0"))
    with pytest.raises(NotFoundError):
        s.submit(fwd_bwd("nope:train:0", 1))
    with pytest.raises(NotFoundError):
        s.submit(fwd_bwd("m:train:0", 1, tenant="mallory"))


def test_backpressure_refuses_samples_but_admits_the_gap_filler(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores, max_inflight_per_tenant=3)
    s.submit(create("m:train:0"))
    drain(s)
    s.submit(fwd_bwd("m:train:0", 2))
    s.submit(fwd_bwd("m:train:0", 3))
    s.submit(sample([2, 3]))
    assert s.queue_state("alice") == "paused_rate_limit"
    with pytest.raises(CapacityError):
        s.submit(sample([2, 3]))
    with pytest.raises(CapacityError):
        s.submit(fwd_bwd("m:train:0", 4))
    s.submit(fwd_bwd("m:train:0", 1))  # fills the gap: always admitted
    assert s.submit(sample([4], tenant="bob")).request_id, "other tenants are unaffected"
    drain(s)
    assert s.queue_state("alice") == "active"


def test_sampling_is_continuous_across_cycles(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores, decode_steps_per_cycle=2)
    long = sample([2, 3], max_tokens=6)
    s.submit(long)
    plan = s.plan()
    assert isinstance(plan, SamplePlan) and plan.admit
    s.complete(plan, run_plan(toy, plan))
    assert not s.futures.get(long.request_id, "alice").is_done
    short = sample([4, 5], max_tokens=1)
    s.submit(short)
    plan = s.plan()
    assert isinstance(plan, SamplePlan) and [it.request_id for it in plan.admit] == [
        short.request_id]
    s.complete(plan, run_plan(toy, plan))
    assert isinstance(result(s, short), Sampled), "the newcomer finished while the long one runs"
    drain(s)
    out = result(s, long)
    assert isinstance(out, Sampled) and out.sequence_ids == (f"{long.request_id}:0",)
    assert len(out.result.sequences[0].tokens) <= 6


def test_old_snapshots_are_dropped_only_after_their_samples_finish(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores, max_sampler_snapshots_per_model=1, decode_steps_per_cycle=1)
    s.residency.add_snapshot("m:train:0", "snap-1", inflight=False)
    toy.create_adapter("snap-1", __import__("loraplex.domain.lora").domain.lora.LoraConfig(4))
    running = sample([2, 3], adapter_id="snap-1", max_tokens=4, source="snapshot")
    s.submit(running)
    plan = s.plan()
    s.complete(plan, run_plan(toy, plan))  # type: ignore[arg-type]
    s.residency.add_snapshot("m:train:0", "snap-2", inflight=False)  # evicts snap-1
    with pytest.raises(UserError, match="snapshot"):
        s.submit(sample([2], adapter_id="snap-1", source="snapshot"))
    assert s.residency.take_releasable() == [], "snap-1 is still in use"
    drain(s)
    assert isinstance(result(s, running), Sampled)
    assert toy.has_adapter("snap-1") is False, "released once its last sample finished"


def test_release_model_waits_for_queued_ops(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    s.submit(create("m:train:0"))
    drain(s)
    fb = fwd_bwd("m:train:0", 1)
    s.submit(fb)
    s.release_model("m:train:0")
    drain(s)
    assert isinstance(result(s, fb), ForwardBackwardResult)
    assert not toy.has_adapter("m:train:0")
    assert not s.has_model("m:train:0")


def test_deficit_round_robin_does_not_let_a_deep_queue_starve_others(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores, token_budget=40, quantum_tokens=10)
    big = [datum(list(range(2, 32)))]  # 30 tokens per op
    for i in range(4):
        s.submit(create(f"a{i}:train:0", tenant="alice"))
    s.submit(create("b:train:0", tenant="bob"))
    drain(s)
    toy.calls.clear()
    for i in range(4):
        s.submit(fwd_bwd(f"a{i}:train:0", 1, big, tenant="alice"))
    s.submit(fwd_bwd("b:train:0", 1, [datum([2, 3, 4, 5])], tenant="bob"))
    drain(s)
    first = next(c for c in toy.calls if c[0] == "forward_backward")
    assert "b:train:0" in first[1], f"bob waited behind alice's deep queue: {toy.calls}"


def test_usage_is_reported_per_op(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores)
    s.submit(create("m:train:0"))
    drain(s)
    s.usage.drain_ops()
    s.submit(fwd_bwd("m:train:0", 1, [datum([2, 3, 4])]))
    s.submit(fwd_bwd("m:train:0", 2, [datum([2, 3])], forward_only=True))
    s.submit(sample([2, 3, 4, 5], max_tokens=3))
    drain(s)
    ops = {u.kind: u for u in s.usage.drain_ops()}
    assert ops["ForwardBackward"].counts.trained_tokens == 3
    assert ops["Forward"].counts.forward_tokens == 2 and ops["Forward"].counts.trained_tokens == 0
    assert (ops["Sample"].counts.prompt_tokens == 4
            and 1 <= ops["Sample"].counts.sampled_tokens <= 3)
    assert all(u.counts.engine_s >= 0 for u in ops.values())
