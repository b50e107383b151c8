"""The Ray head of a ``loraplex serve --workers 1`` dies: the API keeps answering (health says
degraded and why), the server starts a new runtime and a new worker by itself, says so in its
log, and the training run goes on from its last ``save_state`` bitwise. The server with a
runtime of its own runs a model-parallel worker (a group of two rank actors: their calls wait
through the head too, and the group of the old runtime is replaced); the joined cluster's
runs a single-actor one. Also: the runtime the
server started listens on loopback only, as its API does (on main Ray bound every interface,
and the server process ended 60 s after the head did)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import tinker

from loraplex.config import DEFAULT_MODEL_NAME as MODEL
from tests.api.live_server import free_port
from tests.api.test_training import ADAM, DATA, logprobs
from tests.integration.conftest import LORAPLEX_SERVE, REPO
from tests.integration.serve_fake import seed_builtin_tiny

pytest.importorskip("ray")

KEY = "tml-head-loss"


def _health(url: str) -> tuple[dict[str, object], float]:
    began = time.monotonic()
    body = httpx.get(f"{url}/api/v1/healthz", trust_env=False, timeout=5).json()
    return body, time.monotonic() - began


def _wait_health(url: str, proc: subprocess.Popen[bytes], status: str, timeout_s: float
                 ) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server process ended"
        try:
            body, took = _health(url)
        except httpx.HTTPError:
            body, took = {}, 0.0
        assert took < 2.0, f"healthz took {took:.1f} s"
        if body.get("status") == status:
            return body
        time.sleep(0.2)
    raise AssertionError(f"healthz never said {status!r} within {timeout_s} s")


def _ray_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _listeners(processes: list[psutil.Process]) -> set[str]:
    out = set()
    for p in processes:
        try:
            conns = p.net_connections("tcp")
        except psutil.Error:
            continue
        out |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
    return out


RAY_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
"""Ray's token authentication, on in every runtime these tests start or join."""


@contextmanager
def _serve(tmp_path: Path, tiny_model_dir: Path, *cluster: str
           ) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """``loraplex serve`` on the tiny built-in with Ray (``cluster``: its Ray flags)."""
    data = tmp_path / "data"
    seed_builtin_tiny(data, tiny_model_dir)
    port, log_path = free_port(), tmp_path / "serve.log"
    env = {**os.environ, **RAY_AUTH, "LORAPLEX_CLUSTER_HEAD_PROBE_INTERVAL_S": "0.5"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*LORAPLEX_SERVE, "--port", str(port), "--data-dir", str(data),
                                 "--open", "--threads", "1", *cluster], cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc, "ok", 120)
        yield url, proc, log_path
    finally:
        _end(proc)
        for child in psutil.process_iter(["cmdline"]):  # Ray's leftovers of that session
            if str(data) in " ".join(child.info["cmdline"] or ()):
                child.kill()


def _end(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def ray_serve(tmp_path: Path, tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    """A server with a runtime of its own, beside a dead `ray start` head (which Ray's default
    address would join)."""
    decoy_port = free_port()
    decoy = _head(decoy_port, tmp_path / "decoy.log")
    _wait_port(decoy_port)
    _end(decoy, signal.SIGKILL)
    with _serve(tmp_path, tiny_model_dir, "--workers", "1", "--model-parallel", "2") as served:
        yield served


def _trained_and_saved(url: str):  # type: ignore[no-untyped-def]
    """A run one step in, saved; and its logprobs on DATA."""
    tc = tinker.ServiceClient(base_url=url, api_key=KEY).create_lora_training_client(
        base_model=MODEL, rank=4).result()
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()
    tc.save_state("before-head-loss").result()
    return tc, logprobs(tc.forward(DATA, "cross_entropy").result())


def test_the_ray_head_dies_and_the_server_recovers(ray_serve) -> None:  # type: ignore[no-untyped-def]
    url, proc, log_path = ray_serve
    children = _ray_children(proc.pid)
    listening = _listeners(children)
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, listening

    tc, saved = _trained_and_saved(url)

    gcs = [p for p in children if p.name() == "gcs_server"]
    assert len(gcs) == 1, [p.name() for p in children]
    gcs[0].kill()
    degraded = _wait_health(url, proc, "degraded", 30)
    assert "Ray head" in str(degraded["problems"]), degraded
    _wait_health(url, proc, "ok", 120)

    after = logprobs(tc.forward(DATA, "cross_entropy").result(timeout=120))
    assert all(np.array_equal(a, b) for a, b in zip(after, saved, strict=True)), \
        "the run went on from its save_state on the new worker"
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result(timeout=60)
    assert proc.poll() is None
    log = log_path.read_text(errors="replace")
    assert "the Ray head (GCS at" in log and "starting a new local Ray runtime" in log, log
    assert "ray: connected again (runtime 2)" in log, log
    assert log.count("2 stages") == 2, "a group in each runtime"
    new_gcs = [p for p in _ray_children(proc.pid) if p.name() == "gcs_server"]
    assert new_gcs and new_gcs[0].pid != gcs[0].pid


def _head(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """``ray start --head --block`` on ``port`` in a process group of its own."""
    ray_cli = Path(sys.executable).with_name("ray")
    with open(log_path, "ab") as log:
        return subprocess.Popen([str(ray_cli), "start", "--head", "--block", "--port", str(port),
                                 "--num-cpus", "1", "--include-dashboard", "false",
                                 "--node-ip-address", "127.0.0.1"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **RAY_AUTH,
                                     "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})


def _wait_port(port: int, timeout_s: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port}")


def test_a_joined_clusters_head_dies_and_comes_back(tmp_path: Path,
                                                    tiny_model_dir: Path) -> None:
    """``--ray-address``: the head is killed (its whole process group) and started again on
    the same port 5 s later; the server answers throughout, waits, rejoins, and its run goes
    on from its save_state."""
    port = free_port()
    head = _head(port, tmp_path / "head.log")
    try:
        _wait_port(port)
        with _serve(tmp_path, tiny_model_dir, "--ray-address", f"127.0.0.1:{port}",
                    "--workers", "1") as (url, proc, log_path):
            tc, saved = _trained_and_saved(url)
            _end(head, signal.SIGKILL)
            _wait_health(url, proc, "degraded", 30)
            time.sleep(5.0)
            body, _ = _health(url)
            assert body["status"] == "degraded", "still down: still degraded"
            head = _head(port, tmp_path / "head.log")
            _wait_health(url, proc, "ok", 120)
            after = logprobs(tc.forward(DATA, "cross_entropy").result(timeout=120))
            assert all(np.array_equal(a, b) for a, b in zip(after, saved, strict=True))
            log = log_path.read_text(errors="replace")
            assert f"rejoining 127.0.0.1:{port}" in log and "connected again" in log, log
    finally:
        _end(head, signal.SIGKILL)
