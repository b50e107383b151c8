"""``loraplex serve --model-parallel 2`` as a user runs it: a server process that starts two
rank processes of its own (no Ray), answers the SDK, and takes them down when it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import tinker

from benchmarks.harness.server_process import free_port
from loraplex.config import DEFAULT_MODEL_NAME
from tests.api.test_training import datum
from tests.integration.serve_fake import seed_builtin_tiny


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/v1/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_serve_model_parallel_2_trains_and_stops_its_ranks(tmp_path: Path,
                                                            tiny_model_dir: Path) -> None:
    seed_builtin_tiny(tmp_path, tiny_model_dir)
    port = free_port()
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    server = subprocess.Popen(
        [sys.executable, "-m", "loraplex", "serve", "--port", str(port), "--data-dir",
         str(tmp_path), "--open", "--threads", "1", "--model-parallel", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while not healthy(url):
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.5)
        ranks = [p for p in children(server.pid)
                 if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        assert len(ranks) == 2, "two rank processes of the server"
        service = tinker.ServiceClient(base_url=url, api_key="tml-cli-mp")
        tc = service.create_lora_training_client(base_model=DEFAULT_MODEL_NAME, rank=4).result()
        out = tc.forward_backward([datum([2, 3, 4, 5])], "cross_entropy").result()
        assert out.metrics["loss:sum"] > 0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    time.sleep(1)
    assert all(not Path(f"/proc/{p}").exists() or "Z" in
               Path(f"/proc/{p}/stat").read_text().split()[2] for p in ranks), "ranks stopped"
