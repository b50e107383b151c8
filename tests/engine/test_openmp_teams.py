"""No OpenMP team but the compute thread's outlives engine construction or an IO job.

Each check runs in a fresh interpreter at 2 threads and counts the process's OS threads: a
GNU OpenMP team leaves a worker thread behind on the thread that started it, for as long as
that thread lives, and more teams than CPUs make every team sleep between parallel regions
(`loraplex.domain.passing_thread`). The control cases start a team the plain way and see the
extra thread, so the count can tell.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from concurrent.futures import ThreadPoolExecutor
    from loraplex.config import EngineConfig
    from loraplex.engine.executor import Engine
    from loraplex.scheduler.io_workers import ThreadedIo

    def threads():
        return len(os.listdir("/proc/self/task"))

    def parallel_op():
        (torch.ones(1 << 20) * 2.0).sum()

    torch.set_num_threads(2)
    out = {}
    base = threads()
    Engine(sys.argv[1], EngineConfig(num_threads=2, retain_host_memory=False))
    out["engine"] = threads() - base

    io = ThreadedIo(1)
    io.submit(parallel_op)
    io.close()
    out["io_job"] = threads() - base  # the pool's thread is gone after close

    pool = ThreadPoolExecutor(1)
    pool.submit(parallel_op).result()
    out["plain_pool_job"] = threads() - base - 1  # minus the pool's own thread
    pool.shutdown()
    parallel_op()
    out["main_thread_op"] = threads() - base
    print(json.dumps(out))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/task")
def test_construction_and_io_jobs_leave_no_team(tiny_model_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)],
                          capture_output=True, text=True, timeout=300, check=True)
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["engine"] == 0, counts
    assert counts["io_job"] == 0, counts
    # The controls: a team started on a living thread keeps its worker.
    assert counts["plain_pool_job"] == 1, counts
    assert counts["main_thread_op"] == 1, counts
