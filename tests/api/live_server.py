"""The real app served by uvicorn on 127.0.0.1 in a background thread, for in-process tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from loraplex.api.app import create_app
from loraplex.api.context import ServerContext


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_server(ctx: ServerContext) -> Iterator[str]:
    """Serve ``ctx`` until the block exits; yields the base URL."""
    port = ctx.config.port or free_port()
    config = uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="warning",
                            access_log=False, timeout_keep_alive=75)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            health = httpx.get(f"{base_url}/api/v1/healthz", timeout=1, trust_env=False)
            if health.status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:
        raise RuntimeError("server did not start")
    try:
        yield base_url
    finally:
        server.should_exit = True
        thread.join(30)
