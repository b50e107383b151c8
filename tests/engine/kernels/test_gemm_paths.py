"""The packed GEMM kernel's loop paths give one arithmetic: every row-block size, the copies it
makes for speed (an unpacked matrix's panel pairs, rows of x 4 KB apart) and the stretched nest
of a long K change no bit.

References: F.linear where the kernel matches MKL's order (the loader's check), and the kernel
itself on the transposed matrix packed (`matmul_unpacked` must equal `matmul` of the packed
transpose at the same block: the same sums in the same order). Every test runs on the float32
build and on the bfloat16-weight build, whose reference is F.linear on the weight rounded to
bfloat16 and widened back.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.kernels.gemm_order import gemm_kernel
from loraplex.engine.kernels.packed_linear import GemmKernel
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

CPU = torch.device("cpu")


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def kernel(request: pytest.FixtureRequest) -> GemmKernel:
    found = gemm_kernel((576, 1024, 3072), CPU, torch.float32, request.param)
    if found is None:
        pytest.skip("the packed GEMM kernel is not available on this machine")
    return found


def exact(kernel: GemmKernel, w: torch.Tensor) -> torch.Tensor:
    """``w`` as the kernel reads it: rounded to its weight dtype, in float32."""
    return w.to(kernel.weight_dtype).float()


def most_rows(kernel: GemmKernel) -> int:
    """Rows of the kernel's largest micro-kernel (8 with AVX-512, 6 with AVX2)."""
    return 8 if kernel.lanes == 16 else 6


def test_every_row_block_size_gives_each_row_its_bits(kernel: GemmKernel) -> None:
    """Batches of 1 .. 3·MR + 1 rows: each row block size (and the split of the last two blocks)
    computes a row as the full batch does, and as F.linear does from 4 rows up."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, 576, generator=gen)
    x = torch.randn(3 * most_rows(kernel) + 1, 576, generator=gen)
    panels = kernel.pack(w)
    full = kernel.matmul(x, panels, 40, kernel.blocks[576])
    assert torch.equal(full, F.linear(x, exact(kernel, w)))
    for rows in range(1, x.shape[0] + 1):
        part = kernel.matmul(x[:rows], panels, 40, kernel.blocks[576])
        assert torch.equal(part, full[:rows]), rows


@pytest.mark.parametrize("inner", [1024, 3072])
def test_rows_4kb_apart_are_copied_without_changing_a_bit(kernel: GemmKernel, inner: int
                                                          ) -> None:
    """K a multiple of 1024 (rows of x a multiple of 4 KB apart): the kernel copies x in chunks
    with a padded stride; outputs stay F.linear's (at row counts MKL runs on its main kernel,
    multiples of 4) at one and two threads."""
    gen = torch.Generator().manual_seed(inner)
    w = torch.randn(48, inner, generator=gen)
    panels = kernel.pack(w)
    for rows in (8, 12, 40, 600):
        x = torch.randn(rows, inner, generator=gen)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = kernel.matmul(x, panels, 48, kernel.blocks[inner])
            assert torch.equal(got, F.linear(x, exact(kernel, w))), (rows, threads)
    torch.set_num_threads(1)


@pytest.mark.parametrize("inner", [700, 3072, 12288])
def test_unpacked_matmul_equals_the_packed_transpose(kernel: GemmKernel, inner: int) -> None:
    """``x · w`` for ``w [K, O]`` read as it is (its panel pairs copied when several row blocks
    read them, x copied when K is a multiple of 1024, K in stretches when a pair outgrows L2)
    is bitwise the packed kernel on ``wᵀ`` at the same block."""
    gen = torch.Generator().manual_seed(inner)
    out_features = 4 * kernel.lanes
    w_K_O = torch.randn(inner, out_features, generator=gen).to(kernel.weight_dtype)
    packed = kernel.pack(w_K_O.t().contiguous())
    for rows in (1, most_rows(kernel), most_rows(kernel) + 1, 300):
        x = torch.randn(rows, inner, generator=gen)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = kernel.matmul_unpacked(x, w_K_O)
            want = kernel.matmul(x, packed, out_features, 192)
            assert torch.equal(got, want), (rows, threads)
    torch.set_num_threads(1)


def test_a_long_k_in_stretches_keeps_f_linear_bits(kernel: GemmKernel) -> None:
    """A packed weight whose panel pair outgrows half an L2 (K = 16384) runs in stretches of
    whole blocks, the totals carried through y: still F.linear's bits."""
    found = gemm_kernel((16384,), CPU, torch.float32, kernel.weight_dtype)
    assert found is not None and found.blocks == {16384: 192}
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(2 * found.lanes + 3, 16384, generator=gen)
    x = torch.randn(20, 16384, generator=gen)
    got = found.matmul(x, found.pack(w), w.shape[0], 192)
    assert torch.equal(got, F.linear(x, exact(found, w)))
