"""No OpenMP team but the compute thread's outlives engine construction or an IO job.

Each check runs in a fresh interpreter at 2 threads and counts the process's OS threads: a
GNU OpenMP team leaves a worker thread behind on the thread that started it, for as long as
that thread lives, and more teams than CPUs make every team sleep between parallel regions
(`loraplex.domain.passing_thread`). The control cases start a team the plain way and see the
extra thread, so the count can tell.

A team's workers leave on their own after their thread ends (libgomp releases them through a
barrier, then each calls ``pthread_exit``), so a count taken at once can still see one on a
loaded machine (CI saw ``io_job: 1``): each count waits up to `SETTLE_S` for the extra threads
to go. The controls wait `CONTROL_S` and still see theirs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: How long a count waits for a finished team's workers to exit; how long a control waits.
SETTLE_S = 10.0
CONTROL_S = 1.0

SCRIPT = textwrap.dedent("""
    import json, os, sys, threading, time
    import torch
    from concurrent.futures import ThreadPoolExecutor
    from loraplex.config import EngineConfig
    from loraplex.engine.executor import Engine
    from loraplex.scheduler.io_workers import ThreadedIo

    def threads():
        return len(os.listdir("/proc/self/task"))

    def extra(base, wait_s):  # threads above base once they reach it, or after wait_s
        deadline = time.monotonic() + wait_s
        while threads() > base and time.monotonic() < deadline:
            time.sleep(0.01)
        return threads() - base

    def parallel_op():
        (torch.ones(1 << 20) * 2.0).sum()

    SETTLE_S, CONTROL_S = float(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(2)
    out = {}
    base = threads()
    Engine(sys.argv[1], EngineConfig(num_threads=2, retain_host_memory=False))
    out["engine"] = extra(base, SETTLE_S)

    io = ThreadedIo(1)
    ran = threading.Event()
    io.submit(lambda: (parallel_op(), ran.set()))
    ran.wait()
    out["io_job"] = extra(base + 1, SETTLE_S)  # above the IO pool's own (idle) thread
    io.close()

    pool = ThreadPoolExecutor(1)
    pool.submit(parallel_op).result()
    out["plain_pool_job"] = extra(base + 1, CONTROL_S)  # above the pool's own thread
    pool.shutdown()
    parallel_op()
    out["main_thread_op"] = extra(base, CONTROL_S)
    print(json.dumps(out))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/task")
def test_construction_and_io_jobs_leave_no_team(tiny_model_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir), str(SETTLE_S),
                           str(CONTROL_S)],
                          capture_output=True, text=True, timeout=300, check=True)
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["engine"] == 0, counts
    assert counts["io_job"] == 0, counts
    # The controls: a team started on a living thread keeps its worker.
    assert counts["plain_pool_job"] == 1, counts
    assert counts["main_thread_op"] == 1, counts
