"""Paging tests run on one torch thread, as the sampling tests do (see
tests/engine/sampling/conftest.py): bitwise comparisons and timings stay stable on a shared box."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
