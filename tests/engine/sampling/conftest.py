"""Sampler fixtures: one intra-op thread (a loaded 2-core box) and the tiny-model rig."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.sampling.rig import Rig, make_rig
from tests.engine.threads import one_thread

__all__ = ["one_thread", "rig"]


@pytest.fixture
def rig(tiny_model_dir: Path) -> Rig:
    return make_rig(tiny_model_dir)
