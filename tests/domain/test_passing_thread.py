"""`in_passing_thread`: the call's result or exception, on a thread that has ended."""

from __future__ import annotations

import threading

import pytest

from loraplex.domain.passing_thread import in_passing_thread


def test_returns_the_result_computed_on_another_thread() -> None:
    seen: list[threading.Thread] = []

    def call() -> int:
        seen.append(threading.current_thread())
        return 42

    assert in_passing_thread(call, "probe") == 42
    assert seen[0] is not threading.current_thread()
    assert seen[0].name == "probe"
    assert not seen[0].is_alive()


def test_reraises_the_exception_in_the_caller() -> None:
    def fail() -> None:
        raise ValueError("bad field")

    with pytest.raises(ValueError, match="bad field"):
        in_passing_thread(fail)
