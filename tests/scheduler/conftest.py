from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loraplex.store.stores import Stores, open_stores
from tests.fakes import ToyExecutor


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = open_stores(str(tmp_path / "data"))
    yield s
    s.close()


@pytest.fixture
def toy() -> ToyExecutor:
    return ToyExecutor()
