"""The one-intra-op-thread fixture the engine suites share: 2-thread OpenMP GEMMs collapse on a
loaded 2-core box (≈30x slower decode steps), and bitwise comparisons stay stable. A suite turns
it on by importing it into its conftest or test module (it is autouse there)."""

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
