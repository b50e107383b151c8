"""`loraplex serve --workers N` processes of the scale-out benchmark: each with a fresh data dir
holding an operator key and named tenant keys (made before it starts, as ``loraplex keys create
NAME [--operator] --data-dir DIR`` makes them; ``--open`` also admits any other ``tml-`` key),
its own fresh local Ray runtime (``RAY_ADDRESS=local``: never a cluster another job on the
machine started), launched first and waited for together (startup is never measured), its
stats endpoint read with the operator key.

Knows nothing of what a run measures.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.server_process import ServerProcess, free_port

OPERATOR = "scaleout-operator"


def server_env() -> dict[str, str]:
    """The environment of a server (and of anything else here that starts Ray)."""
    return dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                RAY_ADDRESS="local", RAY_DEDUP_LOGS="0")


@dataclass
class WorkerServer:
    """One launched server: its process, its worker count, the operator key its stats are
    read with and the named tenants' keys (``tenant-0``, ``tenant-1``, ...)."""

    process: ServerProcess
    workers: int
    stats_key: str
    tenant_keys: list[str]

    @property
    def url(self) -> str:
        return self.process.base_url

    @property
    def base_model(self) -> str:
        return self.process.base_model

    @property
    def pid(self) -> int:
        return self.process.pid

    def stats(self, recent: int = 0) -> dict[str, Any]:
        return self.process.stats(self.stats_key, recent)

    def stop(self) -> None:
        self.process.stop()


def fresh_data_dir(data_dir: Path, num_tenants: int) -> tuple[str, list[str]]:
    """An empty data dir with an operator key and ``num_tenants`` tenant keys; the keys."""
    from loraplex.store.stores import open_stores

    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    stores = open_stores(str(data_dir))
    try:
        operator = stores.keys.create(OPERATOR, operator=True)
        return operator, [stores.keys.create(f"tenant-{i}") for i in range(num_tenants)]
    finally:
        stores.close()


def launch(model_dir: Path, model_name: str, data_dir: Path, workers: int, *,
           num_tenants: int = 0, threads: int = 1) -> WorkerServer:
    """Start ``loraplex serve --model NAME=DIR --workers W --threads T --open`` on a fresh
    data dir (not yet ready: see `wait_ready`)."""
    operator, tenant_keys = fresh_data_dir(data_dir, num_tenants)
    port = free_port()
    cmd = [sys.executable, "-m", "loraplex", "serve", "--model", f"{model_name}={model_dir}",
           "--data-dir", str(data_dir), "--port", str(port), "--workers", str(workers),
           "--threads", str(threads), "--open"]
    process = ServerProcess.launch(cmd, server_env(), data_dir / "server.log",
                                   base_url=f"http://127.0.0.1:{port}", base_model=model_name)
    return WorkerServer(process, workers, operator, tenant_keys)


def stop_all(servers: Iterable[WorkerServer]) -> None:
    """SIGTERM every server at once, then wait for each (their shutdowns overlap)."""
    servers = list(servers)
    for server in servers:
        if server.process.process.poll() is None:
            server.process.process.terminate()
    for server in servers:
        server.stop()


def wait_ready(servers: Iterable[WorkerServer], timeout_s: float = 900.0) -> None:
    """Until every server answers its health check (each one's Ray runtime and workers up)."""
    for server in servers:
        server.process.wait_ready("/api/v1/healthz", timeout_s)
