"""`retain_freed_memory`: a step's large tensors reuse freed pages instead of faulting in new
ones (counted with getrusage's minor faults, in a fresh process: the setting is process-wide)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

CHILD = """
import json, resource, torch
from loraplex.engine.host_allocator import retain_freed_memory

def faults(steps=4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        (torch.ones(1024, 16384) * 2).sum()  # two 64 MiB tensors per step, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults()
default = faults()
applied = retain_freed_memory()
faults(8)  # the heap settles into the steady state in a few steps
print(json.dumps({"default": default, "applied": applied, "retained": faults(),
                  "again": retain_freed_memory()}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_freed_blocks_are_reused_instead_of_faulted_in_again() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], check=True, capture_output=True,
                         text=True).stdout
    result = json.loads(out)
    assert result["applied"] is True and result["again"] is True
    pages = 4 * 2 * 64 * 2**20 // 4096  # two 64 MiB tensors per iteration
    assert result["default"] > pages // 2  # glibc mmaps and unmaps each one
    assert result["retained"] < pages // 50
