"""A live server (real app, scheduler and stores) for the SDK-driven API tests.

One server per test module; every test makes its own tenant (a fresh ``tml-`` key), so tests
do not see each other's runs. The server runs the torch engine on the built-in tiny model by
default; ``LORAPLEX_TEST_EXECUTOR=toy`` swaps in the toy executor (a quick loop that needs no
torch work). Tests marked `toy_only` inspect or steer the toy's internals: they always get a
toy server of their own.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("TINKER_TELEMETRY", "0")

import tinker

from loraplex.api.context import ServerContext
from loraplex.config import DEFAULT_MODEL_NAME
from tests.api.live_server import live_server
from tests.fakes import ToyExecutor
from tests.integration.serve_fake import fake_context, seed_builtin_tiny

MODEL = DEFAULT_MODEL_NAME
EXECUTOR = os.environ.get("LORAPLEX_TEST_EXECUTOR", "engine")
toy_only = pytest.mark.toy_only
engine_only = pytest.mark.skipif(EXECUTOR != "engine", reason="needs the torch engine's losses")


@dataclass
class Server:
    url: str
    ctx: ServerContext

    @property
    def toy(self) -> ToyExecutor:
        executor = self.ctx.catalog.get(MODEL).lanes.schedulers()[0][1].executor
        assert isinstance(executor, ToyExecutor)
        return executor


def _serve(tmp_path_factory: pytest.TempPathFactory, executor: str, tiny_model_dir: Path
           ) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("loraplex-data")
    seed_builtin_tiny(data_dir, tiny_model_dir)
    ctx = fake_context(str(data_dir), client_config={"fwdbwd_max_chunk_len": 2},
                       executor=executor)
    with live_server(ctx) as url:
        yield Server(url, ctx)
    ctx.stores.close()


@pytest.fixture(scope="module")
def suite_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
                 ) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, EXECUTOR, tiny_model_dir)


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
               ) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, "toy", tiny_model_dir)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Server:
    """The module's server: the suite's executor, or the toy for `toy_only` tests."""
    is_toy = EXECUTOR == "toy" or request.node.get_closest_marker("toy_only") is not None
    chosen: Server = request.getfixturevalue("toy_server" if is_toy else "suite_server")
    return chosen


@pytest.fixture
def new_key() -> Callable[[], str]:
    return lambda: f"tml-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def service_client(server: Server, new_key: Callable[[], str]
                   ) -> Iterator[Callable[..., tinker.ServiceClient]]:
    """Factory of ServiceClients (default: a fresh tenant); all closed after the test."""
    made: list[tinker.ServiceClient] = []

    def make(api_key: str | None = None) -> tinker.ServiceClient:
        client = tinker.ServiceClient(base_url=server.url, api_key=api_key or new_key())
        made.append(client)
        return client

    yield make
    for client in made:
        with contextlib.suppress(Exception):  # a test may have finished the session itself
            client.close("success").result(timeout=90)
