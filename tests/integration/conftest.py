"""Integration fixtures: the real server as a subprocess (`serve_fake.py`; the torch engine on the
built-in tiny model unless ``LORAPLEX_TEST_EXECUTOR`` says otherwise), and a venv with the
official SDK 0.27.0 (made on first use under ``<repo>/.venvs/sdk027``, see `venvs`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.api.live_server import free_port
from tests.integration.serve_fake import seed_builtin_tiny
from tests.integration.venvs import SDK027_STEPS, ensure_venv

REPO = Path(__file__).resolve().parents[2]
SERVE_FAKE_CMD = (sys.executable, str(REPO / "tests" / "integration" / "serve_fake.py"))
LORAPLEX_SERVE = (sys.executable, "-m", "loraplex", "serve", "--host", "127.0.0.1")
CLIENT_ENV = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
              "TINKER_TELEMETRY": "0"}
os.environ.update({k: v for k, v in CLIENT_ENV.items() if k not in os.environ})
EXECUTOR = os.environ.get("LORAPLEX_TEST_EXECUTOR", "engine")
SERVER_THREADS = os.environ.get("LORAPLEX_TEST_THREADS", "")


class ServerProcess:
    """A server in a subprocess on a fixed port and data dir; restartable. ``command`` is
    ``serve_fake.py`` (any executor) by default, or `LORAPLEX_SERVE` (the real CLI)."""

    def __init__(self, data_dir: Path, *args: str, command: Sequence[str] = SERVE_FAKE_CMD
                 ) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.command = tuple(command)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            [*self.command, "--port", str(self.port), "--data-dir", str(self.data_dir),
             *self.args], cwd=REPO)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not become healthy")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.proc = None


@pytest.fixture
def server_process(tmp_path: Path, tiny_model_dir: Path) -> Iterator[ServerProcess]:
    seed_builtin_tiny(tmp_path / "data", tiny_model_dir)
    threads = ("--threads", SERVER_THREADS) if SERVER_THREADS else ()
    server = ServerProcess(tmp_path / "data", "--open", "--executor", EXECUTOR, *threads).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sdk027_python() -> str:
    """Python of a venv holding tinker==0.27.0 (made by `venvs.ensure_venv` when missing)."""
    return ensure_venv("sdk027", SDK027_STEPS,
                       "import tinker, torch; assert tinker.__version__ == '0.27.0'")
