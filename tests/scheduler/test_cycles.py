"""Clock cycles with the toy executor, driven synchronously: what one cycle packs, ordering
around saves, the token budget, timeslice mode and Tinker's pipelining promise."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from loraplex.domain.ids import TinkerPath
from loraplex.domain.ops import CyclePlan
from loraplex.domain.results import ForwardBackwardResult, OptimStepResult
from loraplex.scheduler.runner import run_plan
from loraplex.scheduler.scheduler import Scheduler
from loraplex.store.stores import Stores
from tests.fakes import TOY_STATE_FILE, ToyExecutor
from tests.scheduler.work_builders import (
    FakeClock,
    create,
    datum,
    drain,
    fwd_bwd,
    make_scheduler,
    optim,
    save,
    step,
)


def done(s: Scheduler, item) -> bool:  # type: ignore[no-untyped-def]
    return s.futures.get(item.request_id, item.tenant).is_done


def value(s: Scheduler, item):  # type: ignore[no-untyped-def]
    entry = s.futures.get(item.request_id, item.tenant)
    assert entry.is_done and entry.error is None, entry.error
    return entry.result


def ready(s: Scheduler, toy: ToyExecutor, *models: tuple[str, str]) -> None:
    for model_id, tenant in models:
        s.submit(create(model_id, tenant=tenant))
    drain(s)
    toy.calls.clear()


def test_chunks_of_one_call_and_its_optim_step_share_one_cycle(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores)
    ready(s, toy, ("m:train:0", "alice"))
    chunks = [fwd_bwd("m:train:0", seq, [datum([2 + seq, 3, 4, 5])]) for seq in (1, 2, 3)]
    for item in (chunks[1], chunks[2], optim("m:train:0", 4), chunks[0]):  # SDK order 2, 3, 1
        s.submit(item)
    plan = s.plan()
    assert isinstance(plan, CyclePlan)
    assert [it.seq_id for it in plan.batch] == [1, 2, 3] and [it.seq_id for it in plan.optim] == [4]
    s.complete(plan, run_plan(toy, plan))
    assert toy.calls == [("forward_backward", ("m:train:0",) * 3), ("optim_step", ("m:train:0",))]
    assert s.plan() is None
    # Same adapter state as one call with all the data, then a step (gradients accumulate).
    ref = ToyExecutor()
    ref.create_adapter("m", ref_config := stores.runs.get("m:train:0", "alice").run.lora)
    assert ref_config.rank == 4
    ref.forward_backward([fwd_bwd("m", 1, [d for c in chunks for d in c.op.data]).op])
    ref.optim_step([optim("m", 2).op])
    assert toy.theta("m:train:0") == pytest.approx(ref.theta("m"), rel=1e-12)
    assert stores.runs.get("m:train:0", "alice").num_trained_tokens == 12


def test_many_models_fwd_bwd_and_optim_steps_in_one_cycle(toy: ToyExecutor, stores: Stores
                                                          ) -> None:
    s = make_scheduler(toy, stores)
    tenants = ["alice", "bob", "carol"]
    ready(s, toy, *[(f"m{i}:train:0", t) for i, t in enumerate(tenants)])
    for i, t in enumerate(tenants):
        s.submit(fwd_bwd(f"m{i}:train:0", 1, tenant=t))
        s.submit(optim(f"m{i}:train:0", 2, tenant=t))
    assert drain(s) == 1
    assert toy.calls == [("forward_backward", ("m0:train:0", "m1:train:0", "m2:train:0")),
                         ("optim_step", ("m0:train:0", "m1:train:0", "m2:train:0"))]
    record = s.metrics.recent(1)[0]
    assert (record.kind, record.tenants, record.num_models, record.num_ops) == (
        "cycle", ("alice", "bob", "carol"), 3, 6)


def test_a_save_runs_after_the_step_before_it_and_ends_the_run(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores)
    ready(s, toy, ("m:train:0", "alice"))
    items = [fwd_bwd("m:train:0", 1), optim("m:train:0", 2), save("m:train:0", 3, stores, "a"),
             fwd_bwd("m:train:0", 4)]
    for item in items:
        s.submit(item)
    thetas = []
    while step(s) is not None:
        thetas.append(toy.theta("m:train:0"))
    # The save is file work on the IO workers (here inline), between the two cycles.
    assert [c.kind for c in s.metrics.recent()][-3:] == ["cycle", "io", "cycle"]
    theta_at_save = thetas[0]
    record = stores.checkpoints.find(TinkerPath("m:train:0", "weights", "a"))
    assert record is not None
    with open(os.path.join(record.directory, TOY_STATE_FILE)) as f:
        assert json.load(f)["theta"] == theta_at_save != 0.0, "the save saw the stepped weights"


def test_the_token_budget_cuts_a_run_and_its_optim_step_waits_for_the_rest(
    toy: ToyExecutor, stores: Stores
) -> None:
    s = make_scheduler(toy, stores, token_budget=8)
    ready(s, toy, ("m:train:0", "alice"))
    chunks = [fwd_bwd("m:train:0", seq, [datum([2, 3, 4, 5])]) for seq in (1, 2, 3)]
    step_op = optim("m:train:0", 4)
    for item in (*chunks, step_op):
        s.submit(item)
    first = step(s)
    assert isinstance(first, CyclePlan) and [it.seq_id for it in first.batch] == [1, 2]
    assert first.optim == () and not done(s, step_op)
    second = step(s)
    assert isinstance(second, CyclePlan)
    assert [it.seq_id for it in second.items] == [3, 4]
    assert isinstance(value(s, step_op), OptimStepResult)


def test_timeslice_serves_one_model_per_cycle(toy: ToyExecutor, stores: Stores) -> None:
    s = make_scheduler(toy, stores, timeslice=True)
    ready(s, toy, ("a:train:0", "alice"), ("b:train:0", "bob"))
    for model_id, tenant in (("a:train:0", "alice"), ("b:train:0", "bob")):
        for seq in (1, 2):
            s.submit(fwd_bwd(model_id, seq, tenant=tenant))
        s.submit(optim(model_id, 3, tenant=tenant))
    assert drain(s) == 2
    assert toy.calls == [("forward_backward", ("a:train:0",) * 2), ("optim_step", ("a:train:0",)),
                         ("forward_backward", ("b:train:0",) * 2), ("optim_step", ("b:train:0",))]


def test_timeslice_turns_follow_arrival_so_no_model_is_skipped(
    toy: ToyExecutor, stores: Stores
) -> None:
    clock = FakeClock()
    s = make_scheduler(toy, stores, clock=clock, timeslice=True)
    models = [("a:train:0", "alice"), ("b:train:0", "bob"), ("c:train:0", "carol")]
    ready(s, toy, *models)
    seq = {model_id: 1 for model_id, _ in models}

    def submit_step(model_id: str, tenant: str) -> None:
        clock.now += 1.0
        s.submit(fwd_bwd(model_id, seq[model_id], tenant=tenant))
        s.submit(optim(model_id, seq[model_id] + 1, tenant=tenant))
        seq[model_id] += 2

    for model_id, tenant in models:
        submit_step(model_id, tenant)
    served = []
    for _ in range(7):  # each served model resubmits at once, as a pipelined client does
        plan = step(s)
        assert isinstance(plan, CyclePlan)
        (model_id,) = {it.model_id for it in plan.items}
        served.append(model_id[0])
        submit_step(model_id, plan.items[0].tenant)
    assert "".join(served) == "abcabca"


class BusyServer:
    """Another tenant keeps every cycle busy; a client's reaction to a result lands while the
    next cycle is already running (a real client's round trip), so it runs one cycle later."""

    def __init__(self, s: Scheduler, toy: ToyExecutor) -> None:
        self.s, self.toy = s, toy
        ready(s, toy, ("busy:train:0", "bob"), ("m:train:0", "alice"))
        for seq in range(1, 200):
            s.submit(fwd_bwd("busy:train:0", seq, [datum([2, 3, 4, 5])], tenant="bob"))
        self.cycle = 0
        self.ran_in: dict[str, int] = {}
        self.mid_cycle: list[Callable[[], None]] = []

    def run_cycle(self) -> None:
        plan = self.s.plan()
        assert isinstance(plan, CyclePlan)
        self.cycle += 1
        arrivals, self.mid_cycle = self.mid_cycle, []
        for submit in arrivals:
            submit()
        self.s.complete(plan, run_plan(self.toy, plan))
        for item in plan.items:
            self.ran_in[item.request_id] = self.cycle


@pytest.mark.parametrize(("pipelined", "span"), [(True, 1), (False, 3)])
def test_pipelined_step_takes_one_cycle_an_await_each_step_three(
    toy: ToyExecutor, stores: Stores, pipelined: bool, span: int
) -> None:
    server = BusyServer(make_scheduler(toy, stores, token_budget=8, quantum_tokens=4), toy)
    fb, step_op = fwd_bwd("m:train:0", 1), optim("m:train:0", 2)
    server.s.submit(fb)
    if pipelined:
        server.s.submit(step_op)
    submitted_step = pipelined
    while step_op.request_id not in server.ran_in:
        server.run_cycle()
        if not submitted_step and done(server.s, fb):  # the await-each client reacts
            server.mid_cycle.append(lambda: server.s.submit(step_op))
            submitted_step = True
    assert isinstance(value(server.s, fb), ForwardBackwardResult)
    assert server.ran_in[step_op.request_id] - server.ran_in[fb.request_id] + 1 == span
