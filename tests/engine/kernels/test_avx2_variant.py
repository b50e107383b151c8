"""The kernels' AVX2 variant (what a CPU without AVX-512 builds), compiled here with
``-mno-avx512f``: the packed sgemm still gives F.linear's bits (the order of the sums does not
depend on the vector width), and the attention kernel is right and batch-invariant."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.kernels import native_library
from loraplex.engine.kernels.attention_kernel import AttentionKernel, AttentionRuns
from loraplex.engine.kernels.gemm_order import SOURCE, matching_block
from loraplex.engine.kernels.packed_linear import GemmKernel
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

KERNELS = SOURCE.parent


def _has_avx2() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx2" in flags and " fma" in flags


pytestmark = pytest.mark.skipif(shutil.which("cc") is None or not _has_avx2(),
                                reason="needs cc and an AVX2+FMA CPU")


def build(name: str) -> native_library.NativeLibrary:
    built = native_library.load(KERNELS / f"{name}.c", ("-mno-avx512f",))
    assert built.handle is not None, built.reason
    return built


def test_avx2_gemm_gives_f_linear_bits() -> None:
    handle = build("packed_gemm").handle
    assert handle is not None and handle.lp_lanes() == 8
    probe = GemmKernel(handle, 8, {})
    found = {k: matching_block(probe, k) for k in (64, 576, 1536)}
    blocks = {k: b for k, b in found.items() if b is not None}
    assert len(blocks) == 3, found
    kernel = GemmKernel(handle, 8, blocks)
    gen = torch.Generator().manual_seed(0)
    for inner in (576, 1536):
        for out_features in (16, 20, 1000):
            w = torch.randn(out_features, inner, generator=gen)
            x = torch.randn(36, inner, generator=gen)
            got = kernel.matmul(x, kernel.pack(w), out_features, blocks[inner])
            assert torch.equal(got, F.linear(x, w))
    w_K_O = torch.randn(300, 48, generator=gen)
    x = torch.randn(13, 300, generator=gen)
    want = x.double() @ w_K_O.double()
    assert (kernel.matmul_unpacked(x, w_K_O).double() - want).abs().max() <= 1e-4 * want.abs().max()


def test_avx2_attention_is_right_and_row_invariant() -> None:
    handle = build("paged_attention").handle
    assert handle is not None and handle.la_lanes() == 8
    kernel = AttentionKernel(handle, 8)
    heads, kv_heads, head_dim, block = 4, 2, 16, 64
    gen = torch.Generator().manual_seed(1)
    k_pages = torch.randn(3, kv_heads, block, head_dim, generator=gen)
    v_pages = torch.randn(3, kv_heads, block, head_dim, generator=gen)
    q = torch.randn(150, heads, head_dim, generator=gen) * 0.5
    table = torch.tensor([[2, 0, 1]])
    out, _ = kernel.forward(q, k_pages, v_pages, AttentionRuns.of(150, [0], [150], [0], table))
    keys = k_pages[[2, 0, 1]].transpose(1, 2).reshape(-1, kv_heads, head_dim)[:150]
    values = v_pages[[2, 0, 1]].transpose(1, 2).reshape(-1, kv_heads, head_dim)[:150]
    want = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1),
                                          values.transpose(0, 1), is_causal=True, scale=1.0,
                                          enable_gqa=True).transpose(0, 1).reshape(150, -1)
    assert (out - want).abs().max() <= 2e-5
    for position in (0, 70, 149):  # the same token as a one-row decode step: the same bits
        one, _ = kernel.forward(q[position:position + 1], k_pages, v_pages,
                                AttentionRuns.of(1, [0], [1], [position], table))
        assert torch.equal(one[0], out[position])
