"""The official SDK 0.27.0 (its own venv) drives the server: SFT, sampling, resume through
weights_info + create_model + load_weights, GRPO with every RL loss, forward_backward_custom,
REST listing, tenant isolation and the archive download; and resume after a server restart."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loraplex.config import DEFAULT_MODEL_NAME
from tests.integration.conftest import CLIENT_ENV, ServerProcess

CLIENT = Path(__file__).with_name("client_sdk027.py")


def run_client(python: str, server: ServerProcess, key: str, *phase: str) -> dict[str, Any]:
    done = subprocess.run([python, str(CLIENT), server.url, key, DEFAULT_MODEL_NAME, *phase],
                          env={**os.environ, **CLIENT_ENV}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["phase"] == phase[0]
    return summary


@pytest.mark.slow
def test_sdk_027_client_run(server_process: ServerProcess, sdk027_python: str) -> None:
    summary = run_client(sdk027_python, server_process, "tml-sdk027", "main")
    assert summary["state"].endswith("/weights/c1")
    assert set(summary["rl_loss"]) == {"importance_sampling", "ppo", "cispo", "dro",
                                       "stable_reinforce"}


@pytest.mark.slow
def test_sdk_027_resumes_exactly_after_a_server_restart(
    server_process: ServerProcess, sdk027_python: str, tmp_path: Path
) -> None:
    state_file = str(tmp_path / "never_stopped.json")
    run_client(sdk027_python, server_process, "tml-sdk027-restart", "before-restart", state_file)
    server_process.stop()
    server_process.start()
    run_client(sdk027_python, server_process, "tml-sdk027-restart", "after-restart", state_file)
