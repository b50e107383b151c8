"""`serve_cmd.prepare` sets the host-memory policy before the stores start their journal
thread, so the thread that computes (started later, like the clock thread) reuses freed
large blocks instead of faulting them in again; set up the other way round (the policy from the
engine's constructor, after the journal thread), it faults in every one (measured with
getrusage's minor faults, in fresh processes: the policy is process-wide)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, os, resource, sys, threading, torch
from loraplex.cli.main import build_parser
from loraplex.cli.serve_cmd import build_context, executors_of, load_from_args, prepare
from loraplex.engine.host_allocator import retain_freed_memory

def faults(steps=4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        (torch.ones(1024, 16384) * 2).sum()  # two 64 MiB tensors per step, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

args = build_parser().parse_args(["serve", "--model", "A/b=builtin:tiny", "--open",
                                  "--data-dir", sys.argv[2]])
config = load_from_args(args).config
if sys.argv[1] == "prepare":
    ctx = prepare(config)
else:  # the previous order: stores and engine first, the policy from inside the engine
    ctx = build_context(config.server, config.scheduler, executors_of(config))
    retain_freed_memory()
out = {"threads": [t.name for t in threading.enumerate()]}

def compute():  # where the clock thread computes
    faults(16)
    out["faults"] = faults()

thread = threading.Thread(target=compute)
thread.start()
thread.join()
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)  # the stores' threads are daemons; nothing to flush
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_prepare_sets_the_memory_policy_before_any_thread_allocates(tmp_path: Path) -> None:
    def run(mode: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        out = subprocess.run([sys.executable, "-c", CHILD, mode, str(tmp_path / mode)],
                             check=True, capture_output=True, text=True, env=env).stdout
        return json.loads(out.strip().splitlines()[-1])

    pages = 4 * 2 * 64 * 2**20 // 4096
    late = run("late")
    assert "loraplex-journal" in late["threads"]  # the thread that makes the order matter
    assert late["faults"] > pages // 2  # its arena keeps nothing: every tensor faults in
    assert run("prepare")["faults"] <= pages // 8 + 64  # the bound of test_host_allocator
