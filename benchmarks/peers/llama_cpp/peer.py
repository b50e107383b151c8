"""The parent's handle on the llama.cpp worker (`worker.py`, run by the llama-cpp-python venv's
python): start it on a GGUF file, send it JSON commands, stop it. The worker inherits this
process's CPU affinity, so both sides run on the same cores.

    with LlamaCppPeer(python, gguf, threads=1, log=path) as peer:
        reply = peer.request({"op": "run", "mode": "batched", ...})
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import IO, Any

WORKER = Path(__file__).resolve().parent / "worker.py"


class LlamaCppPeer:
    """A running worker; one request at a time, answered in order."""

    def __init__(self, python: Path, gguf: Path, threads: int, log: Path,
                 flash_attn: bool = False) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        # llama.cpp's own messages (its stderr), open for the worker's life
        self._log: IO[str] = open(log, "w")  # noqa: SIM115
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.pop("PYTHONPATH", None)  # the venv sees neither loraplex nor benchmarks
        self._proc = subprocess.Popen(
            [str(python), str(WORKER), "--model", str(gguf), "--threads", str(threads),
             "--flash-attn", "on" if flash_attn else "off"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            env=env)
        self.log_path = log
        ready = self._read()
        assert ready.get("ready"), ready

    def request(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send one command, wait for its reply.

        Raises:
            RuntimeError: the worker died (its log's tail in the message).
        """
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._log.flush()
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"llama.cpp worker exited (rc {self._proc.wait()}):\n{tail}")
        return dict(json.loads(line))

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> LlamaCppPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
