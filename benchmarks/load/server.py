"""The load benchmark's server: one `loraplex serve` child (builtin:tiny, ``--open``, a fresh data
dir, short session idle timeout / future TTL / housekeeping interval from ``LORAPLEX_*``
variables, so sessions expire within the run), and a thread sampling its resident memory from
/proc.

The fresh data dir gets the built-in model linked in from a cache (created once, keyed by a
hash of the generator's sources): the server then skips writing it, ≈ 4 CPU-s per run, which
matters for the smoke run's time on two shared cores; everything the server writes is fresh.

Knows the server only as a process, its config variables and HTTP; measures nothing else.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.procs import rss_bytes
from benchmarks.harness.server_process import ServerProcess, free_port, log_tail

MODEL_NAME = "Qwen/Qwen3-8B"
MODEL_SOURCE = "builtin:tiny"
OBSERVER_KEY = "tml-load-observer"


@dataclass(frozen=True)
class ServerSettings:
    """What the server is started with (recorded in the result).

    Attributes:
        session_idle_timeout_s, future_ttl_s, housekeeping_interval_s: ``server.*`` config.
        threads: torch intra-op threads (``--threads``; None: torch's default).
        max_inflight_per_tenant: ``scheduler.max_inflight_per_tenant`` (None: the server's
            default).
    """

    session_idle_timeout_s: float
    future_ttl_s: float
    housekeeping_interval_s: float
    threads: int | None = 1
    max_inflight_per_tenant: int | None = None

    def environment(self) -> dict[str, str]:
        env = {"LORAPLEX_SERVER_SESSION_IDLE_TIMEOUT_S": str(self.session_idle_timeout_s),
               "LORAPLEX_SERVER_FUTURE_TTL_S": str(self.future_ttl_s),
               "LORAPLEX_SERVER_HOUSEKEEPING_INTERVAL_S": str(self.housekeeping_interval_s)}
        if self.max_inflight_per_tenant is not None:
            env["LORAPLEX_SCHEDULER_MAX_INFLIGHT_PER_TENANT"] = str(
                self.max_inflight_per_tenant)
        return env


def cached_builtin_model(cache_root: Path) -> Path:
    """The built-in tiny model's directory under ``cache_root``, created on first use."""
    import loraplex.engine.builtin as generator
    from loraplex.cli.model_sources import BUILTIN_ARCH, BUILTIN_SEED

    sources = sorted(Path(generator.__file__).parent.glob("*.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)
                            + f"{BUILTIN_ARCH}-{BUILTIN_SEED}".encode()).hexdigest()[:12]
    cached = cache_root / f"builtin-tiny-{digest}"
    if not (cached / "config.json").exists():
        from loraplex.engine.builtin.model import create_builtin_model

        staging = cache_root / f".{cached.name}-{os.getpid()}"
        create_builtin_model(staging, BUILTIN_ARCH, "tiny", BUILTIN_SEED)
        try:
            staging.rename(cached)
        except OSError:  # another run made it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
    return cached


@contextmanager
def load_server(settings: ServerSettings, data_dir: Path, model_cache: Path | None = None
                ) -> Iterator[ServerProcess]:
    """Start the server (inherited ``LORAPLEX_*`` variables dropped: only ours apply), wait
    until healthy, stop it on exit. With ``model_cache``, the built-in model is linked into
    the data dir from there (`cached_builtin_model`)."""
    from loraplex.cli.model_sources import builtin_dir

    data_dir.mkdir(parents=True, exist_ok=True)
    if model_cache is not None:
        model_dir = Path(builtin_dir(str(data_dir), "tiny"))
        model_dir.parent.mkdir(parents=True, exist_ok=True)
        model_dir.symlink_to(cached_builtin_model(model_cache).resolve(), True)
    port = free_port()
    threads = [] if settings.threads is None else ["--threads", str(settings.threads)]
    cmd = [sys.executable, "-m", "loraplex", "serve", "--model", f"{MODEL_NAME}={MODEL_SOURCE}",
           "--open", "--data-dir", str(data_dir), "--port", str(port), *threads]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    env.update(settings.environment(), NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    process = ServerProcess.start(cmd, env, data_dir / "server.log",
                                  base_url=f"http://127.0.0.1:{port}", base_model=MODEL_NAME)
    try:
        yield process
    except Exception:
        print(f"server log {process.log_path} (last lines):\n{log_tail(process.log_path)}",
              file=sys.stderr)
        raise
    finally:
        process.stop()


class RssSampler:
    """A daemon thread appending ``(wall time, RSS bytes)`` every ``interval_s``."""

    def __init__(self, pid: int, interval_s: float) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), rss_bytes(self.pid)))
            self._stop.wait(self.interval_s)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join(5)
        return list(self.samples)
