"""Integration fixtures: the real server as a subprocess (`serve_fake.py`), and a venv with the
official SDK 0.27.0 (created on first use under ``<repo>/.venvs/sdk027`` from PyPI)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.live_server import free_port

REPO = Path(__file__).resolve().parents[2]
SERVE_FAKE = REPO / "tests" / "integration" / "serve_fake.py"
SDK027_VENV = REPO / ".venvs" / "sdk027"
CLIENT_ENV = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
              "TINKER_TELEMETRY": "0"}
os.environ.update({k: v for k, v in CLIENT_ENV.items() if k not in os.environ})
EXECUTOR = os.environ.get("LORAPLEX_TEST_EXECUTOR", "toy")


class ServerProcess:
    """``serve_fake.py`` in a subprocess on a fixed port and data dir; restartable."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVE_FAKE), "--port", str(self.port), "--data-dir",
             str(self.data_dir), *self.args], cwd=REPO)
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
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data", "--open", "--executor", EXECUTOR).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sdk027_python() -> str:
    """Python of a venv holding tinker==0.27.0 (installed from PyPI when missing)."""
    python = SDK027_VENV / "bin" / "python"
    check = [str(python), "-c", "import tinker; assert tinker.__version__ == '0.27.0'"]
    if not python.exists() or subprocess.run(check, capture_output=True).returncode != 0:
        subprocess.run([sys.executable, "-m", "venv", str(SDK027_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "tinker==0.27.0"],
                       check=True, timeout=900)
    return str(python)
