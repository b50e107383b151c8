"""Servers for the fuzz suites: a fresh in-process engine server per fuzz module (the real app
over real HTTP on 127.0.0.1, `tests.api.live_server`) and one unfuzzed reference server for the
concurrent trainer's replay."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
os.environ.setdefault("TINKER_TELEMETRY", "0")

from tests.api.live_server import live_server
from tests.integration.serve_fake import fake_context, seed_builtin_tiny

LONG_POLL_S = 0.25  # short: the fuzzer polls futures that may wait forever behind a seq gap


def _engine_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
                   ) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("fuzz-data")
    seed_builtin_tiny(data_dir, tiny_model_dir)
    ctx = fake_context(str(data_dir), executor="engine", long_poll_s=LONG_POLL_S)
    with live_server(ctx) as url:
        yield url
    ctx.stores.close()


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
                ) -> Iterator[str]:
    """A fresh server for one fuzz module."""
    yield from _engine_server(tmp_path_factory, tiny_model_dir)


@pytest.fixture(scope="session")
def reference_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
                     ) -> Iterator[str]:
    """A server nobody fuzzes: the trainer's steps replayed here are the expected bits."""
    yield from _engine_server(tmp_path_factory, tiny_model_dir)
