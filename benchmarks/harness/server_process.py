"""A benchmark server running as its own process group: launch, wait for health, stop.

Owns process lifetime only (a server and whatever it spawns, e.g. SkyRL's engine subprocess,
share one process group, so `stop` ends all of them and nothing else); knows nothing about what
the server serves beyond the command lines of `loraplex serve` and of the test suite's fake
server (`serve_loraplex`, `serve_fake`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks import REPO

HEALTH_PATH = "/api/v1/healthz"
#: The API tests' server on a fake executor (`--executor toy|noop`): no model needed.
FAKE_SERVER = REPO / "tests" / "integration" / "serve_fake.py"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, num_lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return "(no log)"


@dataclass
class ServerProcess:
    """A launched server: its process (group leader), where it logs, and how clients reach it."""

    process: subprocess.Popen[bytes]
    log_path: Path
    base_url: str
    base_model: str

    @property
    def run_dir(self) -> Path:
        return self.log_path.parent

    @property
    def pid(self) -> int:
        return self.process.pid

    def stats(self, key: str, recent: int = 0) -> dict[str, Any]:
        """``/api/v1/loraplex/stats`` with ``recent`` cycle records, as ``key`` sees it (an
        operator key sees every tenant; a tenant key its own tenant's counters at least)."""
        request = urllib.request.Request(f"{self.base_url}/api/v1/loraplex/stats?recent={recent}",
                                         headers={"X-API-Key": key})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=120) as response:
            return dict(json.loads(response.read()))

    @classmethod
    def launch(cls, cmd: Sequence[str], env: dict[str, str], log_path: Path, *,
               base_url: str, base_model: str, cwd: Path | None = None) -> ServerProcess:
        """Start `cmd` in a new session (its own process group), stdout+stderr to `log_path`.
        ``cwd``: where it runs (``python -m`` imports from there before ``PYTHONPATH``)."""
        with open(log_path, "ab") as log:
            process = subprocess.Popen(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       cwd=cwd)
        return cls(process, log_path, base_url, base_model)

    @classmethod
    def start(cls, cmd: Sequence[str], env: dict[str, str], log_path: Path, *, base_url: str,
              base_model: str, cwd: Path | None = None, timeout_s: float = 600.0
              ) -> ServerProcess:
        """`launch`, then `wait_ready` on loraplex's health route."""
        server = cls.launch(cmd, env, log_path, base_url=base_url, base_model=base_model,
                            cwd=cwd)
        server.wait_ready(HEALTH_PATH, timeout_s)
        return server

    def wait_ready(self, health_path: str, timeout_s: float) -> None:
        """Poll `GET base_url + health_path` until it answers 200.

        Raises:
            RuntimeError: the process exited first, or `timeout_s` passed (server is stopped).
        """
        deadline = time.monotonic() + timeout_s
        url = self.base_url + health_path
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with code {self.process.returncode} before it "
                                   f"was ready; {self.log_path}:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s; {self.log_path}:\n"
                           f"{log_tail(self.log_path)}")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the leader (it stops its own children), SIGKILL the group after `timeout_s`."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(10)
        # Children (e.g. an engine subprocess) may outlive a leader that exited on its own.
        self._signal_group(signal.SIGKILL)
        return self.process.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve_loraplex(model: str, source: str, data_dir: Path, *args: str,
                   env: Mapping[str, str] | None = None, timeout_s: float = 600.0
                   ) -> ServerProcess:
    """`loraplex serve --model MODEL=SOURCE --open` on a free port with its data in `data_dir`
    (log: ``data_dir/server.log``), `args` appended, `env` over this process's environment;
    returns once it is healthy."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, "-m", "loraplex", "serve", "--model", f"{model}={source}", "--open",
           "--data-dir", str(data_dir), "--port", str(port), *args]
    full_env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", **(env or {})}
    return ServerProcess.start(cmd, full_env, data_dir / "server.log", cwd=REPO,
                               base_url=f"http://127.0.0.1:{port}", base_model=model,
                               timeout_s=timeout_s)


def serve_fake(model: str, data_dir: Path, *args: str, timeout_s: float = 600.0
               ) -> ServerProcess:
    """`FAKE_SERVER` (``--open``, `args` appended) on a free port, like `serve_loraplex`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, str(FAKE_SERVER), "--port", str(port), "--data-dir", str(data_dir),
           "--open", *args]
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    return ServerProcess.start(cmd, env, data_dir / "server.log", cwd=REPO,
                               base_url=f"http://127.0.0.1:{port}", base_model=model,
                               timeout_s=timeout_s)
