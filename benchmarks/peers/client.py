"""Run `client_bench.py` with a given interpreter against a given server; return its JSON.

The interpreter decides the SDK version (SkyRL's venv has tinker 0.25, loraplex's has 0.38), so
the same script measures both servers. Knows nothing about which server it talks to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CLIENT_SCRIPT = Path(__file__).resolve().parent / "client_bench.py"


def run_client(
    python: str | os.PathLike[str],
    base_url: str,
    base_model: str,
    args: Sequence[str],
    out_path: str | os.PathLike[str],
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """`python client_bench.py --base-url .. --base-model .. --out out_path *args` → its JSON.

    Progress lines stream to this process's stderr.

    Raises:
        subprocess.CalledProcessError: the client failed (its output has already streamed).
        subprocess.TimeoutExpired: it ran past `timeout_s`.
    """
    env = dict(os.environ if env is None else env)
    env.setdefault("NO_PROXY", "127.0.0.1,localhost")
    env.setdefault("no_proxy", "127.0.0.1,localhost")
    cmd = [str(python), str(CLIENT_SCRIPT), "--base-url", base_url, "--base-model", base_model,
           "--out", str(out_path), *args]
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr, timeout=timeout_s)
    return dict(json.loads(Path(out_path).read_text()))
