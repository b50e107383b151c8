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
