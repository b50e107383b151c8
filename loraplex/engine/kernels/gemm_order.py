"""`gemm_kernel`: the packed sgemm kernel, checked on this machine to give F.linear's bits.

Float addition is not associative, so two GEMMs agree bit for bit only if they sum every
output's products in the same order. MKL's sgemm on the x86 CPUs we run on sums an output's K
products in blocks (k ascending), each block a chain of fused multiply-adds from zero, and
adds each block's sum to the running total: blocks of 192 for K ≥ 384, two halves of ⌊K/2⌋
(and a 1-product tail when K is odd) for 192 < K < 384, one block up to 192. Measured here
for K from 16 to 11008, 8 to 2048 rows, one and two threads (`tests/engine/kernels/`).

That is a fact about one library on one CPU family, not a contract, so the loader checks it
where it runs: for each inner dimension of the model's base GEMMs, random GEMMs at several
row counts through the kernel with each candidate block size until one gives bitwise the
F.linear result, at the engine's thread count. An inner dimension that no candidate matches
stays on F.linear (logged); so does everything when the kernel cannot be built here. The
check is necessary, not sufficient (it compares random inputs); the batch-invariance suites,
which run through the kernel wherever it is enabled, remain the real proof.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from loraplex.engine.kernels import native_library
from loraplex.engine.kernels.packed_linear import GemmKernel

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("packed_gemm.c")
#: Row counts of the probes: one micro-kernel block, a partial one, several.
PROBE_ROWS = (8, 20, 72)
#: Output columns of the probes: whole panel pairs, a lone panel and a partial one.
PROBE_COLUMNS = 83


def candidate_blocks(inner: int) -> tuple[int, ...]:
    """Block sizes to try for inner dimension ``inner``, MKL's observed rule first."""
    observed = inner if inner <= 192 else (inner // 2 if inner < 384 else 192)
    return tuple(dict.fromkeys(b for b in (observed, 192, inner // 2, 256, 128, 384, 96, 512,
                                           inner) if b >= 1))


def matching_block(kernel: GemmKernel, inner: int) -> int | None:
    """The first candidate block at which the kernel gives F.linear's bits at ``inner`` (on
    weights exact in the kernel's weight dtype)."""
    gen = torch.Generator().manual_seed(inner)
    w = torch.randn(PROBE_COLUMNS, inner, generator=gen).to(kernel.weight_dtype).float()
    xs = [torch.randn(rows, inner, generator=gen) for rows in PROBE_ROWS]
    wants = [F.linear(x, w) for x in xs]
    panels = kernel.pack(w)
    for block in candidate_blocks(inner):
        if all(torch.equal(kernel.matmul(x, panels, PROBE_COLUMNS, block), want)
               for x, want in zip(xs, wants, strict=True)):
            return block
    return None


#: The weight dtypes the kernel reads, and the flags that build its library for each.
WEIGHT_DEFINES = {torch.float32: (), torch.bfloat16: ("-DLP_WEIGHT_BF16",)}


def gemm_kernel(inner_dims: tuple[int, ...], device: torch.device, dtype: torch.dtype,
                weight_dtype: torch.dtype = torch.float32) -> GemmKernel | None:
    """The kernel for float32 inputs and ``weight_dtype`` weights (float32 or bfloat16) with the
    block size of every inner dimension it matches F.linear at (at the current torch thread
    count), or None when it cannot be used here (the reason is logged)."""
    if device.type != "cpu" or dtype != torch.float32 or weight_dtype not in WEIGHT_DEFINES:
        return None
    found = native_library.vectorized(SOURCE.stem, "lp_lanes", "base GEMMs use F.linear",
                                      WEIGHT_DEFINES[weight_dtype])
    if found is None:
        return None
    handle, lanes = found
    probe = GemmKernel(handle, lanes, {}, weight_dtype)
    blocks = {k: b for k in sorted(set(inner_dims)) if (b := matching_block(probe, k))}
    missing = sorted(set(inner_dims) - set(blocks))
    if missing:
        log.warning("packed GEMM kernel does not reproduce F.linear's bits at inner dims %s "
                    "on this machine (%d threads); those GEMMs use F.linear", missing,
                    torch.get_num_threads())
    return GemmKernel(handle, lanes, blocks, weight_dtype) if blocks else None
