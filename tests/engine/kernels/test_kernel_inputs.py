"""The C kernels check what they are handed before reading it: random valid shapes give the
torch reference's numbers, and every out-of-range dimension, row, table offset or page id is
a ValueError with nothing read or written (they used to trust their inputs: a block size of 0
looped forever, a page id past the pool read whatever memory followed)."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.kernels import native_library
from loraplex.engine.kernels.attention_kernel import AttentionKernel, AttentionRuns
from loraplex.engine.kernels.packed_linear import GemmKernel
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")


@pytest.fixture(scope="module")
def attention() -> AttentionKernel:
    native = native_library.packaged("paged_attention")
    if native.handle is None or native.handle.la_lanes() == 0:
        pytest.skip(native.reason or "no AVX2/AVX-512")
    return AttentionKernel(native.handle, int(native.handle.la_lanes()))


def reference(q, k_pages, v_pages, table, cached):  # type: ignore[no-untyped-def]
    """Causal attention of q's rows (positions cached .. cached + R − 1) over the table's
    pages, by torch."""
    rows, kv = q.shape[0], k_pages.shape[1]
    keys = k_pages[table].transpose(1, 2).reshape(-1, kv, k_pages.shape[3])[:cached + rows]
    values = v_pages[table].transpose(1, 2).reshape(-1, kv, v_pages.shape[3])[:cached + rows]
    mask = torch.arange(cached + rows)[None, :] <= (cached + torch.arange(rows))[:, None]
    return F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=mask,
        scale=1.0, enable_gqa=True).transpose(0, 1).reshape(rows, -1)


def test_random_valid_shapes_equal_torch(attention: AttentionKernel) -> None:
    rng = random.Random(0)
    lanes = attention.lanes
    for _ in range(12):
        kv = rng.choice([1, 2])
        heads = kv * rng.choice([1, 2, 4])
        head_dim, block = lanes * rng.choice([1, 2]), lanes * rng.choice([1, 2, 4])
        pages = rng.randint(2, 6)
        cached, new = rng.randint(0, block), rng.randint(1, 40)
        needed = -(-(cached + new) // block)
        if needed > pages:
            pages = needed
        gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
        k_pages = torch.randn(pages, kv, block, head_dim, generator=gen)
        v_pages = torch.randn(pages, kv, block, head_dim, generator=gen)
        q = torch.randn(new, heads, head_dim, generator=gen) * 0.5
        table = torch.tensor([rng.sample(range(pages), needed)])
        out, _ = attention.forward(q, k_pages, v_pages,
                                   AttentionRuns.of(new, [0], [new], [cached], table))
        want = reference(q, k_pages, v_pages, table[0], cached)
        assert (out - want).abs().max() <= 3e-5


def bad_inputs(attention: AttentionKernel) -> dict[str, tuple]:  # type: ignore[type-arg]
    lanes = attention.lanes
    k = torch.zeros(3, 1, lanes, lanes)
    q = torch.zeros(5, 2, lanes)
    runs = AttentionRuns.of(5, [0], [5], [0], torch.tensor([[1]]))
    return {
        "page id past the pool": (q, k, k, replace(runs, tables_B_N=torch.tensor([[3]]))),
        "negative page id": (q, k, k, replace(runs, tables_B_N=torch.tensor([[-1]]))),
        "more pages than the table row": (q, k, k, AttentionRuns.of(
            5, [0], [5], [lanes], torch.tensor([[1]]))),
        "run past the rows": (q[:2], k, k, runs),
        "table offset past the tables": (q, k, k, replace(runs, run_table_U=torch.tensor([7]),
                                                          seq_table_S=torch.tensor([7]))),
        "block size 0": (q, torch.zeros(3, 1, 0, lanes), torch.zeros(3, 1, 0, lanes), runs),
        "heads not a multiple of kv heads": (torch.zeros(5, 3, lanes), torch.zeros(3, 2, lanes,
                                                                                   lanes),
                                             torch.zeros(3, 2, lanes, lanes), runs),
    }


@pytest.mark.parametrize("case", ["page id past the pool", "negative page id",
                                  "more pages than the table row", "run past the rows",
                                  "table offset past the tables", "block size 0",
                                  "heads not a multiple of kv heads"])
def test_out_of_range_inputs_are_refused(attention: AttentionKernel, case: str) -> None:
    q, k, v, runs = bad_inputs(attention)[case]
    with pytest.raises(ValueError, match="refused"):
        attention.forward(q, k, v, runs)
    if runs.seq_row_S.numel():
        with pytest.raises(ValueError, match="refused"):
            attention.backward(q, k, v, torch.zeros_like(q), torch.zeros(q.shape[:2]),
                               torch.zeros(q.shape[:2]), runs)


def test_the_gemm_refuses_a_zero_block() -> None:
    native = native_library.packaged("packed_gemm")
    if native.handle is None or native.handle.lp_lanes() == 0:
        pytest.skip(native.reason or "no AVX2/AVX-512")
    lanes = int(native.handle.lp_lanes())
    kernel = GemmKernel(native.handle, lanes, {})
    w = torch.randn(lanes * 2, 32)
    with pytest.raises(ValueError, match="refused"):
        kernel.matmul(torch.randn(4, 32), kernel.pack(w), lanes * 2, 0)
