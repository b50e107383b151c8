"""Sampler fixtures: one intra-op thread (a loaded 2-core box) and the tiny-model rig."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.engine.sampling.rig import Rig, make_rig


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def rig(tiny_model_dir: Path) -> Rig:
    return make_rig(tiny_model_dir)
