"""ServerProcess: stop ends the server and everything it spawned; a server that dies before it
is healthy fails fast with its log."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.harness.server_process import ServerProcess, free_port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_stop_ends_the_leader_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # The leader ignores SIGTERM and leaves a child behind, like an API server with an engine.
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    server = ServerProcess.launch([sys.executable, "-c", code], dict(os.environ),
                                  tmp_path / "server.log", base_url="http://x", base_model="m")
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pid_file.read_text())
    server.stop(timeout_s=0.5)
    time.sleep(0.2)
    assert not _alive(server.process.pid)
    assert not _alive(child)


def test_wait_ready_reports_an_early_exit_with_the_log_tail(tmp_path: Path) -> None:
    code = "import sys; print('no such model dir'); sys.exit(3)"
    server = ServerProcess.launch([sys.executable, "-c", code], dict(os.environ),
                                  tmp_path / "server.log",
                                  base_url=f"http://127.0.0.1:{free_port()}", base_model="m")
    with pytest.raises(RuntimeError, match=r"(?s)code 3.*no such model dir"):
        server.wait_ready("/healthz", timeout_s=30)
