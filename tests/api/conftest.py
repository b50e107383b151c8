"""A live server (real app, scheduler and stores, toy executor) for the SDK-driven API tests.

One server per test module; every test makes its own tenant (a fresh ``tml-`` key), so tests
do not see each other's runs. ``LORAPLEX_TEST_EXECUTOR=engine`` runs the same tests on the
torch engine (built-in tiny model); tests marked `toy_only` need the toy's internals.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("TINKER_TELEMETRY", "0")

import tinker

from loraplex.api.context import ServerContext
from loraplex.config import DEFAULT_MODEL_NAME
from tests.api.live_server import live_server
from tests.fakes import ToyExecutor
from tests.integration.serve_fake import fake_context

MODEL = DEFAULT_MODEL_NAME
EXECUTOR = os.environ.get("LORAPLEX_TEST_EXECUTOR", "toy")
toy_only = pytest.mark.skipif(EXECUTOR != "toy", reason="inspects the toy executor")


@dataclass
class Server:
    url: str
    ctx: ServerContext

    @property
    def toy(self) -> ToyExecutor:
        executor = self.ctx.catalog.get(MODEL).scheduler.executor
        assert isinstance(executor, ToyExecutor)
        return executor


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("loraplex-data")
    ctx = fake_context(str(data_dir), client_config={"fwdbwd_max_chunk_len": 2},
                       executor=EXECUTOR)
    with live_server(ctx) as url:
        yield Server(url, ctx)
    ctx.stores.close()


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
            client.close("success").result(timeout=30)
