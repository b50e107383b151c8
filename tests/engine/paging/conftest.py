"""Paging tests run on one torch thread, as the sampling tests do: bitwise comparisons and
timings stay stable on a shared box."""

from tests.engine.threads import one_thread

__all__ = ["one_thread"]
