"""`retain_freed_memory`: keep freed host memory in the process for reuse (glibc malloc).

glibc serves a large block (above ``M_MMAP_THRESHOLD``, at most 32 MiB) with a fresh ``mmap``
and unmaps it when it is freed, so every step's big tensors — a training step's
``[tokens, vocab]`` logits, their log-softmax and gradients; a decode step's per-layer
activations — come back as new zeroed pages, each one a page fault. On SmolLM2-135M (1
thread) that is ~0.9 s of kernel time per 8 × 128-token training step and ~24 ms per 32-row
decode step, plus the user time of touching fresh pages. With mmap off and trimming
disabled, freed blocks stay in the heap and the next step reuses them, as a caching GPU
allocator's do. All threads share one arena: a thread other than the main one (the clock
thread, which computes) would otherwise allocate from arenas of 64 MiB heaps, which do not
keep such blocks (SmolLM2, 2048-token training step at 2 threads on a second thread: 616k page
faults and 15.5 s, against 98k and 13.9 s on the main thread). `release_freed_memory` gives
the kept memory back (the clock loop calls it through ``BatchExecutor.release_memory`` after
each second without work, so a burst's peak does not stay resident). A no-op where libc is
not glibc.

The one-arena part holds only for threads that first allocate after it: call it before any
thread but the main one allocates (`cli.serve_cmd.prepare` does, before the stores start their
journal thread); a process whose runtime starts threads first (a Ray worker) gets it from
`SINGLE_ARENA_ENV` at exec instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from contextlib import contextmanager

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1

#: The environment that gives a process one malloc arena from its start (glibc reads it before
#: any thread exists): for processes that start threads before our code runs.
SINGLE_ARENA_ENV = {"MALLOC_ARENA_MAX": "1"}


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's glibc, looked up once (`find_library` runs ``ldconfig``; the idle clock
    loop releases memory every second)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def release_freed_memory() -> bool:
    """Hand the freed memory kept so far back to the OS (``malloc_trim``): what an idle
    server calls, so that a step's or a request's peak does not stay resident. True where
    applied (glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


@functools.cache
def retain_freed_memory() -> bool:
    """Serve every allocation of every thread from the main heap and keep freed memory there
    (up to 2 GiB free at the top of the heap); once per process, before the threads that
    compute start. True where applied (glibc), else False."""
    libc = _glibc()
    if libc is None:
        return False
    return all(bool(libc.mallopt(option, value)) for option, value in
               ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX)))


@contextmanager
def mapped_large_blocks(threshold_bytes: int) -> Iterator[None]:
    """Inside the block, blocks of at least ``threshold_bytes`` get an ``mmap`` of their own
    and go back to the OS when freed; after it, the retained policy again (blocks mapped
    inside are still unmapped when freed later). For one long-context training step: with
    every activation recomputed layer by layer, its temporaries are freed in a pattern that
    leaves the retained heap full of holes the next layer cannot reuse (SmolLM2, 2,048-token
    step: +35 MB of free heap per layer, 1.1 GB over the step's live bytes), whereas the
    page faults of mapping cost little next to such a step's compute. A no-op unless
    `retain_freed_memory` applied (it is the only policy that needs it)."""
    libc = _glibc()
    if libc is None or not retain_freed_memory.cache_info().currsize:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes)
    libc.mallopt(_M_MMAP_MAX, _INT_MAX)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, 0)
