"""The multiplex benchmark's tenant processes: ``size`` long-lived `multiplex/tenant.py`
workers (one OS process per tenant, named 0, 1, ...), started at once and kept for every run;
the scale-out benchmark's throughput phase uses them too.
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.harness.workers import Workers

TENANT_SCRIPT = Path(__file__).resolve().parent / "tenant.py"


def tenant_pool(size: int, log_dir: Path, python: str = sys.executable) -> Workers:
    """``size`` tenants, each logging to ``tenant-<i>.log`` in ``log_dir``, once all have
    started (``python``'s installed ``tinker`` is the SDK the tenants use)."""
    pool = Workers(log_dir, log_prefix="tenant-")
    for i in range(size):
        pool.spawn(i, TENANT_SCRIPT, python)
    pool.wait_all(range(size), "started", timeout_s=600.0)
    return pool
