"""The future store: wake-ups, fetch grace and TTL, tenant scoping, the durable journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.domain.ops import ModelCreated
from loraplex.errors import NotFoundError, ServerError, UserError
from loraplex.scheduler.futures import FETCHED_GRACE_S, FutureStore
from loraplex.store.stores import open_stores


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_waiters_are_woken_once_on_completion() -> None:
    store = FutureStore(ttl_s=100)
    store.create("r1", "alice", "CreateModel")
    woken: list[str] = []
    store.subscribe("r1", lambda: woken.append("a"))
    unsubscribe = store.subscribe("r1", lambda: woken.append("b"))
    unsubscribe()
    store.resolve("r1", ModelCreated("m"))
    store.resolve("r1", ModelCreated("again"))  # completing twice is ignored
    assert woken == ["a"]
    store.subscribe("r1", lambda: woken.append("late"))  # already done: at once
    assert woken == ["a", "late"]
    assert store.get("r1", "alice").result == ModelCreated("m")


def test_entries_are_scoped_to_their_tenant() -> None:
    store = FutureStore(ttl_s=100)
    store.create("r1", "alice", "OptimStep")
    with pytest.raises(NotFoundError):
        store.get("r1", "bob")
    with pytest.raises(NotFoundError):
        store.get("nope", "alice")


def test_results_stay_until_fetched_then_a_grace_period_or_the_ttl() -> None:
    clock = Clock()
    store = FutureStore(ttl_s=1000, clock=clock)
    for rid in ("fetched", "unfetched"):
        store.create(rid, "alice", "OptimStep")
        store.resolve(rid, None)
    store.mark_fetched("fetched")
    clock.now = FETCHED_GRACE_S + 1
    assert store.sweep() == 1
    store.get("unfetched", "alice")
    clock.now = 1001
    assert store.sweep() == 1
    with pytest.raises(NotFoundError):
        store.get("unfetched", "alice")


def test_the_journal_answers_for_requests_a_restart_lost(tmp_path: Path) -> None:
    stores = open_stores(str(tmp_path))
    before = FutureStore(ttl_s=100, journal=stores.futures)
    before.create("pending", "alice", "ForwardBackward")
    before.create("failed", "alice", "ForwardBackward")
    before.fail("failed", UserError("data[0]: bad"))
    after = FutureStore(ttl_s=100, journal=stores.futures)  # the restarted server
    lost = after.get("pending", "alice")
    assert isinstance(lost.error, ServerError) and "restarted" in lost.error.message
    failed = after.get("failed", "alice")
    assert isinstance(failed.error, UserError) and failed.error.message == "data[0]: bad"
    with pytest.raises(NotFoundError):
        after.get("pending", "bob")


def test_a_failure_keeps_only_its_message_not_the_request_behind_it() -> None:
    store = FutureStore(ttl_s=100)
    store.create("r1", "alice", "ForwardBackward")
    payload = bytearray(10**6)  # stands for the decoded request a traceback would hold

    def fail() -> None:
        local = payload  # noqa: F841  (kept alive by the frame a traceback would hold)
        raise UserError("data[0]: bad", field="data[0]")

    try:
        fail()
    except UserError as exc:
        store.fail("r1", exc)
    error = store.get("r1", "alice").error
    assert error is not None and error.message == "data[0]: bad" and error.field == "data[0]"
    assert error.__traceback__ is None and error.__context__ is None


def test_unfetched_results_count_against_the_tenants_quota_until_fetched_or_expired() -> None:
    from loraplex.errors import CapacityError

    clock = Clock()
    store = FutureStore(ttl_s=100, clock=clock, max_unfetched_bytes=600)
    for rid in ("r1", "r2", "r3"):
        store.create(rid, "alice", "CreateModel")
        store.resolve(rid, ModelCreated("m"))  # 256 bytes each
    assert store.unfetched_bytes("alice") == 768 and store.unfetched_bytes("bob") == 0
    with pytest.raises(CapacityError, match="not fetched"):
        store.check_room("alice")
    store.check_room("bob")
    store.mark_fetched("r1")
    store.mark_fetched("r1")  # a second fetch releases nothing more
    assert store.unfetched_bytes("alice") == 512
    store.check_room("alice")
    clock.now = 101.0
    store.sweep()  # r2, r3 expire unfetched
    assert store.unfetched_bytes("alice") == 0
