"""`row_quantum`: the GEMM row padding at which this machine's GEMMs keep each row's bits.

Batch-invariant mode pads every GEMM's row count to a multiple of ``row_multiple``. That makes
a row's result independent of the batch only if the GEMM library computes a row the same way
for every padded row count. MKL on x86 does so for row counts that are multiples of 4 at one
thread and at two threads, and it does not for 1–3 rows (its small-M path) nor for 5–7 or 9–11
rows at two threads (measured on the CI machine; `tests/engine/model/test_row_quantum.py`).
Other libraries, CPUs and thread counts may differ, so the loader checks the requested multiple
once, on this machine, at the model's own inner dimensions, before it serves anything: if the
multiple fails the check, it doubles it until one passes (and says so in the log).

The check is necessary, not sufficient: it compares random rows at a handful of row counts
and offsets. The batch-invariance test suites remain the real proof.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

#: Largest padding tried before giving up on the check (the multiple requested is kept then).
MAX_ROW_MULTIPLE = 64
#: Output columns of the probe GEMMs (a column depends on its weight row only).
PROBE_COLUMNS = 256


def rows_keep_bits(inner_dims: tuple[int, ...], multiple: int, device: torch.device,
                   dtype: torch.dtype) -> bool:
    """Whether ``F.linear`` gives every row the same bits at ``multiple``, 2×, 3×, 4× and 8×
    ``multiple`` rows, from any row offset that is itself a multiple, as in a 16× batch."""
    gen = torch.Generator().manual_seed(0)
    counts = (multiple, 2 * multiple, 3 * multiple, 4 * multiple, 8 * multiple)
    for inner in inner_dims:
        x = torch.randn(16 * multiple, inner, generator=gen).to(device, dtype)
        w = torch.randn(PROBE_COLUMNS, inner, generator=gen).to(device, dtype)
        reference = F.linear(x, w)
        for count in counts:
            for start in (0, multiple, 5 * multiple):
                rows = slice(start, start + count)
                if not torch.equal(F.linear(x[rows], w), reference[rows]):
                    return False
    return True


def row_quantum(requested: int, inner_dims: tuple[int, ...], device: torch.device,
                dtype: torch.dtype) -> int:
    """The smallest of ``requested``, 2×, 4×, … (up to `MAX_ROW_MULTIPLE`) that passes
    `rows_keep_bits`; ``requested`` itself, with a warning, if none does."""
    dims = tuple(sorted(set(inner_dims)))
    multiple = requested
    while multiple <= MAX_ROW_MULTIPLE:
        if rows_keep_bits(dims, multiple, device, dtype):
            if multiple != requested:
                log.warning("GEMM rows padded to %d change bits on this machine (%d threads); "
                            "batch-invariant mode pads to %d", requested,
                            torch.get_num_threads(), multiple)
            return multiple
        multiple *= 2
    log.warning("no row padding up to %d keeps GEMM bits on this machine; batch invariance "
                "is not guaranteed (row_multiple %d kept)", MAX_ROW_MULTIPLE, requested)
    return requested
