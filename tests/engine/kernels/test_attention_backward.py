"""The C attention backward (``paged_attention_backward.h``) against autograd through SDPA in
float64, on sequences of several lengths with scattered pages, GQA, a cached prefix, padding
rows and pages holding NaN past the last key; a sequence's gradients are the same bits in any
batch and at any thread count; shared pages are detected (the model then takes the torch
backward)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.kernels import native_library
from loraplex.engine.kernels.attention_kernel import (
    AttentionKernel,
    AttentionRuns,
    attention_kernel,
)

HEADS, KV_HEADS, DIM, BLOCK = 6, 2, 32, 64


@pytest.fixture(scope="module", params=["native", "avx2"])
def kernel(request: pytest.FixtureRequest) -> AttentionKernel:
    """The kernel as this machine builds it, and its AVX2 variant (``-mno-avx512f``)."""
    found = attention_kernel(torch.device("cpu"), torch.float32)
    if found is None:
        pytest.skip("no attention kernel on this machine (no cc or no AVX2)")
    if request.param == "native":
        return found
    built = native_library.load(Path(native_library.__file__).with_name("paged_attention.c"),
                                ("-mno-avx512f",))
    assert built.handle is not None, built.reason
    return AttentionKernel(built.handle, int(built.handle.la_lanes()))


def _batch(lengths: list[int], cached: list[int], pad: int, seed: int):
    """Rows of every sequence (then ``pad`` padding rows), pages in a shuffled order, NaN in
    every page slot no sequence holds."""
    gen = torch.Generator().manual_seed(seed)
    pages_of = [-(-(c + n) // BLOCK) for c, n in zip(cached, lengths, strict=True)]
    order = torch.randperm(sum(pages_of) + 2, generator=gen).tolist()  # 2 pages nobody reads
    tables = torch.zeros(len(lengths), max(pages_of), dtype=torch.int64)
    k_pages = torch.full((len(order), KV_HEADS, BLOCK, DIM), float("nan"))
    v_pages = torch.full_like(k_pages, float("nan"))
    at = 0
    for i, n in enumerate(pages_of):
        tables[i, :n] = torch.tensor(order[at:at + n])
        at += n
        keys = cached[i] + lengths[i]
        for b in range(n):
            m = min(BLOCK, keys - b * BLOCK)
            k_pages[tables[i, b], :, :m] = torch.randn(KV_HEADS, m, DIM, generator=gen)
            v_pages[tables[i, b], :, :m] = torch.randn(KV_HEADS, m, DIM, generator=gen)
    rows = sum(lengths) + pad
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    q = torch.randn(rows, HEADS, DIM, generator=gen) * DIM ** -0.5
    d_out = torch.randn(rows, HEADS, DIM, generator=gen)
    runs = AttentionRuns.of(rows, starts, lengths, cached, tables)
    return q, k_pages, v_pages, d_out, runs, tables, starts


def _reference(q, k_pages, v_pages, d_out, tables, starts, lengths, cached):
    """Float64 autograd through SDPA, sequence by sequence: (dq, dk_pages, dv_pages)."""
    q64 = q.double().requires_grad_()
    k64 = k_pages.nan_to_num().double().requires_grad_()
    v64 = v_pages.nan_to_num().double().requires_grad_()
    total = q64.new_zeros(())
    for i, (start, n, c) in enumerate(zip(starts, lengths, cached, strict=True)):
        pages = tables[i, :-(-(c + n) // BLOCK)]
        keys = k64[pages].transpose(1, 2).reshape(-1, KV_HEADS, DIM)[:c + n]
        values = v64[pages].transpose(1, 2).reshape(-1, KV_HEADS, DIM)[:c + n]
        mask = torch.arange(c + n)[None, :] <= (c + torch.arange(n))[:, None]
        out = F.scaled_dot_product_attention(
            q64[start:start + n].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=mask, scale=1.0, enable_gqa=True).transpose(0, 1)
        total = total + (out * d_out[start:start + n].double()).sum()
    total.backward()
    return q64.grad, k64.grad, v64.grad


def _kernel_grads(kernel, q, k_pages, v_pages, d_out, runs):
    out, lse = kernel.forward(q, k_pages, v_pages, runs)
    delta = (d_out * out.view_as(d_out)).sum(-1)
    return kernel.backward(q, k_pages, v_pages, d_out, lse, delta, runs)


def test_gradients_match_autograd_through_sdpa(kernel: AttentionKernel) -> None:
    lengths, cached = [150, 1, 64, 17], [0, 40, 0, 70]
    q, k_pages, v_pages, d_out, runs, tables, starts = _batch(lengths, cached, pad=3, seed=0)
    assert runs.pages_disjoint(BLOCK)
    d_q, d_k, d_v = _kernel_grads(kernel, q, k_pages, v_pages, d_out, runs)
    want_q, want_k, want_v = _reference(q, k_pages, v_pages, d_out, tables, starts, lengths,
                                        cached)
    for got, want in ((d_q, want_q), (d_k, want_k), (d_v, want_v)):
        assert torch.isfinite(got).all()
        assert (got.double() - want).abs().max() <= 2e-5 * max(1.0, want.abs().max().item())
    assert d_q[-3:].eq(0).all()  # padding rows


def test_a_sequence_gets_the_same_bits_in_any_batch_and_thread_count(
        kernel: AttentionKernel) -> None:
    q, k_pages, v_pages, d_out, runs, _, _ = _batch([200, 33, 90], [0, 0, 5], pad=0, seed=1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        d_q, d_k, d_v = _kernel_grads(kernel, q, k_pages, v_pages, d_out, runs)
        torch.set_num_threads(2)
        again = _kernel_grads(kernel, q, k_pages, v_pages, d_out, runs)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip((d_q, d_k, d_v), again, strict=True))
    # the middle sequence alone (rows 200..232, its own table row): the same bits
    one = AttentionRuns.of(33, [0], [33], [0], runs.tables_B_N[1:2])
    alone_q, alone_k, alone_v = _kernel_grads(kernel, q[200:233], k_pages, v_pages,
                                              d_out[200:233], one)
    assert torch.equal(alone_q, d_q[200:233])
    pages = runs.tables_B_N[1, :1]
    assert torch.equal(alone_k[pages], d_k[pages]) and torch.equal(alone_v[pages], d_v[pages])


def test_shared_pages_and_too_few_items_take_the_torch_backward() -> None:
    tables = torch.tensor([[3, 1], [3, 2]])  # a shared prompt page
    runs = AttentionRuns.of(20, [0, 10], [10, 10], [64, 64], tables)
    assert not runs.pages_disjoint(BLOCK)
    separate = AttentionRuns.of(20, [0, 10], [10, 10], [0, 0], tables[:, 1:])
    assert separate.pages_disjoint(BLOCK)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)  # 2 sequences × 2 kv heads: one item per thread
        assert AttentionKernel.backward_fits(separate, 2, BLOCK)
        assert not AttentionKernel.backward_fits(runs, 2, BLOCK)
        torch.set_num_threads(5)  # a thread without an item: the tiles spread it better
        assert not AttentionKernel.backward_fits(separate, 2, BLOCK)
    finally:
        torch.set_num_threads(threads)


def test_rows_that_are_not_consecutive_positions_are_refused(kernel: AttentionKernel) -> None:
    q, k_pages, v_pages, d_out, runs, _, _ = _batch([40], [0], pad=0, seed=2)
    lse, delta = torch.zeros(40, HEADS), torch.zeros(40, HEADS)
    keys = runs.row_keys_R.clone()
    keys[[10, 11]] = keys[[11, 10]]
    shuffled = replace(runs, row_keys_R=keys)
    with pytest.raises(ValueError, match="consecutive positions"):
        kernel.backward(q, k_pages, v_pages, d_out, lse, delta, shuffled)
