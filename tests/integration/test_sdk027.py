"""The official SDK 0.27.0 (its own venv) drives the server: SFT, sampling, resume through
weights_info + create_model + load_weights, and the archive download."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from loraplex.config import DEFAULT_MODEL_NAME
from tests.integration.conftest import CLIENT_ENV, ServerProcess

CLIENT = Path(__file__).with_name("client_sdk027.py")


@pytest.mark.slow
def test_sdk_027_client_run(server_process: ServerProcess, sdk027_python: str) -> None:
    done = subprocess.run(
        [sdk027_python, str(CLIENT), server_process.url, "tml-sdk027", DEFAULT_MODEL_NAME],
        env={**os.environ, **CLIENT_ENV}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["state"].endswith("/weights/c1")
