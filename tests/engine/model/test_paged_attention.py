"""Tiled paged attention (and its handwritten backward) against dense SDPA with autograd, with
its forward from the tiles and from the C kernel (`engine.kernels.attention_kernel`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.kernels.attention_kernel import AttentionKernel, attention_kernel
from loraplex.engine.model.attention import dense_attention, tiled_paged_attention
from loraplex.engine.model.kv_cache import scratch_pages
from loraplex.engine.model.packed_batch import PackedBatch, SequenceInput, pack_sequences

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def native() -> AttentionKernel:
    kernel = attention_kernel(torch.device("cpu"), torch.float32)
    if kernel is None:
        pytest.skip("the C attention kernel is not available on this machine")
    return kernel


def attend(kind: str, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
           batch: PackedBatch) -> torch.Tensor:
    """The tiles' forward (``tiled``) or the C kernel's (``native``); the same backward."""
    if kind == "native":
        return tiled_paged_attention(q, k_pages, v_pages, batch.tiles, native(),
                                     batch.attention_runs)
    return tiled_paged_attention(q, k_pages, v_pages, batch.tiles)


def reference(q_R_H_D: torch.Tensor, k_R_H_D: torch.Tensor, v_R_H_D: torch.Tensor,
              starts: list[int], lengths: list[int]) -> torch.Tensor:
    """Causal SDPA per sequence on contiguous rows (no pages, no tiles)."""
    out = torch.zeros(q_R_H_D.shape[0], HEADS * HEAD_DIM)
    for s, n in zip(starts, lengths, strict=True):
        q, k, v = (t[s:s + n].transpose(0, 1) for t in (q_R_H_D, k_R_H_D, v_R_H_D))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0, enable_gqa=True)
        out = out.index_copy(0, torch.arange(s, s + n), o.transpose(0, 1).reshape(n, -1))
    return out


@pytest.mark.parametrize("lengths", [[1, 63, 64, 65, 150, 17], [300, 2, 129]])
def test_tiled_forward_and_backward_match_dense_sdpa(lengths: list[int]) -> None:
    batch = pack_sequences([SequenceInput([0] * n) for n in lengths], row_multiple=16,
                           block_size=64, num_heads=HEADS, num_kv_heads=KV_HEADS)
    gen = torch.Generator().manual_seed(0)
    rows = batch.num_rows
    q = (torch.randn(rows, HEADS, HEAD_DIM, generator=gen) * 0.5).requires_grad_()
    k = torch.randn(rows, KV_HEADS, HEAD_DIM, generator=gen).requires_grad_()
    v = torch.randn(rows, KV_HEADS, HEAD_DIM, generator=gen).requires_grad_()
    grad_out = torch.randn(rows, HEADS * HEAD_DIM, generator=gen)

    def run(kind: str) -> tuple[torch.Tensor, ...]:
        if kind == "reference":
            out = reference(q, k, v, list(batch.seq_row_start), lengths)
        else:
            assert batch.num_scratch_blocks is not None
            pages = [scratch_pages(batch.num_scratch_blocks, 64, batch.write_block_W,
                                   batch.write_offset_W, x.index_select(0, batch.write_rows_W))
                     for x in (k, v)]
            if kind in ("tiled", "native"):
                out = attend(kind, q, pages[0], pages[1], batch)
            else:
                out = dense_attention(q, pages[0], pages[1], batch, KV_HEADS)
        real = batch.row_index()
        out = out.index_select(0, real)
        grads = torch.autograd.grad(out, (q, k, v), grad_out.index_select(0, real))
        return (out.detach(), *grads)

    expected = run("reference")
    for kind in ("tiled", "native", "dense"):
        for got, want in zip(run(kind), expected, strict=True):
            assert (got - want).abs().max().item() <= 2e-5


@pytest.mark.parametrize("kind", ["tiled", "native"])
def test_padded_query_rows_stay_finite_in_backward(kind: str) -> None:
    """Pad rows (no real token) get a valid key and zero gradient, never NaN."""
    batch = pack_sequences([SequenceInput([0] * 3, None, 37, [0])], row_multiple=16,
                           block_size=64, num_heads=HEADS, num_kv_heads=KV_HEADS)
    k_pages = torch.randn(1, KV_HEADS, 64, HEAD_DIM, requires_grad=True)
    v_pages = torch.randn(1, KV_HEADS, 64, HEAD_DIM, requires_grad=True)
    q = torch.randn(batch.num_rows, HEADS, HEAD_DIM, requires_grad=True)
    out = attend(kind, q, k_pages, v_pages, batch)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k_pages, v_pages))
    assert k_pages.grad is not None and k_pages.grad[:, :, 40:].abs().sum() == 0  # never visible


def test_dense_attention_reads_only_the_pages_a_sequence_uses() -> None:
    """Short tables are padded with page 0 in the batch; page 0 holds NaN here and must not
    leak into any output (nor may the unused tail of a longer table)."""
    batch = pack_sequences([SequenceInput([0] * 5, None, 10, [3]),
                            SequenceInput([0] * 2, None, 140, [1, 2, 4, 0])],
                           row_multiple=16, block_size=64, num_heads=HEADS,
                           num_kv_heads=KV_HEADS)
    gen = torch.Generator().manual_seed(3)
    k_pages = torch.randn(6, KV_HEADS, 64, HEAD_DIM, generator=gen)
    v_pages = torch.randn(6, KV_HEADS, 64, HEAD_DIM, generator=gen)
    k_pages[0], v_pages[0] = float("nan"), float("nan")
    q = torch.randn(batch.num_rows, HEADS, HEAD_DIM, generator=gen)
    dense = dense_attention(q, k_pages, v_pages, batch, KV_HEADS)
    tiled = tiled_paged_attention(q, k_pages, v_pages, batch.tiles)
    assert torch.isfinite(dense).all()
    assert (dense - tiled).abs().max().item() <= 2e-5


@pytest.mark.parametrize("kind", ["tiled", "native"])
def test_tiles_shared_across_sequences_match_per_sequence_attention(kind: str) -> None:
    """A prefill whose pages other sequences of the same forward also read (a suffix after
    a cached page, and one-token decodes over two of its full pages), so tokens of different
    sequences share tiles for some steps and then split: each token attends exactly its own
    sequence's keys."""
    seqs = [SequenceInput([0] * 200, None, 0, [0, 1, 2, 3]),
            SequenceInput([0] * 37, None, 64, [0, 5]),
            *(SequenceInput([0], None, 130, [0, 1, 6 + i]) for i in range(3))]
    batch = pack_sequences(seqs, row_multiple=16, block_size=64, num_heads=HEADS,
                           num_kv_heads=KV_HEADS)
    gen = torch.Generator().manual_seed(4)
    k_pages = torch.randn(9, KV_HEADS, 64, HEAD_DIM, generator=gen)
    v_pages = torch.randn(9, KV_HEADS, 64, HEAD_DIM, generator=gen)
    q = torch.randn(batch.num_rows, HEADS, HEAD_DIM, generator=gen) * 0.5
    out = attend(kind, q, k_pages, v_pages, batch)
    assert any(p.first_step > 0 for p in batch.tiles.phases)  # the plan did regroup rows
    for s, start in zip(seqs, batch.seq_row_start, strict=True):
        assert s.block_table is not None
        keys = s.num_cached + len(s.tokens)
        k, v = (pages[list(s.block_table)].transpose(1, 2).reshape(-1, KV_HEADS, HEAD_DIM)[:keys]
                .transpose(0, 1) for pages in (k_pages, v_pages))
        rows = q[start:start + len(s.tokens)].transpose(0, 1)
        positions = torch.arange(s.num_cached, keys)
        mask = torch.arange(keys)[None, :] <= positions[:, None]
        want = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=1.0,
                                              enable_gqa=True)
        got = out[start:start + len(s.tokens)]
        assert (got - want.transpose(0, 1).reshape(len(s.tokens), -1)).abs().max() <= 2e-5


def test_native_rows_are_the_same_bits_in_any_run() -> None:
    """The C kernel computes each row alone: a token's output is the same bits whether it is
    one of a 200-token training sequence (runs of 16 rows), the suffix of a prefill or a
    one-token decode over the cache, wherever it sits in the batch."""
    gen = torch.Generator().manual_seed(5)
    k_pages = torch.randn(6, KV_HEADS, 64, HEAD_DIM, generator=gen)
    v_pages = torch.randn(6, KV_HEADS, 64, HEAD_DIM, generator=gen)
    q_T = torch.randn(200, HEADS, HEAD_DIM, generator=gen) * 0.5
    table = [3, 1, 4, 5]
    full = pack_sequences([SequenceInput([0] * 200, None, 0, table)], row_multiple=8,
                          block_size=64, num_heads=HEADS, num_kv_heads=KV_HEADS)
    rows = torch.arange(full.num_rows).clamp(max=199)
    want = attend("native", q_T[rows], k_pages, v_pages, full)[:200]
    for position in (0, 63, 64, 150, 199):
        others = [SequenceInput([0] * 9, None, 30, [0, 2])]
        step = pack_sequences([*others, SequenceInput([0], None, position, table)],
                              row_multiple=8, block_size=64, num_heads=HEADS,
                              num_kv_heads=KV_HEADS)
        q = torch.zeros(step.num_rows, HEADS, HEAD_DIM)
        row = step.seq_row_start[1]
        q[row] = q_T[position]
        got = attend("native", q, k_pages, v_pages, step)
        assert torch.equal(got[row], want[position])
        assert step.num_rows > 10 and not got[10:].any()  # padding rows: zeros, never garbage


def eager_window_sinks(q_R_H_D: torch.Tensor, k_R_H_D: torch.Tensor, v_R_H_D: torch.Tensor,
                       starts: list[int], lengths: list[int], window: int | None,
                       sinks_H: torch.Tensor | None) -> torch.Tensor:
    """transformers' gpt-oss eager attention per sequence: causal (and sliding-window) mask,
    the sink logit concatenated to every row's scores, softmax, the sink's column dropped."""
    out = torch.zeros(q_R_H_D.shape[0], HEADS * HEAD_DIM)
    for s, n in zip(starts, lengths, strict=True):
        q = q_R_H_D[s:s + n].transpose(0, 1)
        k, v = (t[s:s + n].repeat_interleave(HEADS // KV_HEADS, 1).transpose(0, 1)
                for t in (k_R_H_D, v_R_H_D))
        scores = q @ k.transpose(-1, -2)
        pos = torch.arange(n)
        visible = pos[None, :] <= pos[:, None]
        if window is not None:
            visible &= pos[:, None] - pos[None, :] < window
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks_H is not None:
            scores = torch.cat([scores, sinks_H.view(-1, 1, 1).expand(-1, n, 1)], dim=-1)
        probs = torch.softmax(scores - scores.amax(-1, keepdim=True), dim=-1)[..., :n]
        o = (probs @ v).transpose(0, 1).reshape(n, -1)
        out = out.index_copy(0, torch.arange(s, s + n), o)
    return out


@pytest.mark.parametrize(("window", "sinks"), [(48, True), (48, False), (None, True),
                                                (100, True)])
def test_tiled_window_and_sinks_forward_and_backward_match_the_eager_reference(
        window: int | None, sinks: bool) -> None:
    from loraplex.engine.model.attention import AttentionExtras

    lengths = [1, 47, 48, 130, 200, 65]
    batch = pack_sequences([SequenceInput([0] * n) for n in lengths], row_multiple=16,
                           block_size=64, num_heads=HEADS, num_kv_heads=KV_HEADS)
    gen = torch.Generator().manual_seed(5)
    rows = batch.num_rows
    q = (torch.randn(rows, HEADS, HEAD_DIM, generator=gen) * 0.5).requires_grad_()
    k = torch.randn(rows, KV_HEADS, HEAD_DIM, generator=gen).requires_grad_()
    v = torch.randn(rows, KV_HEADS, HEAD_DIM, generator=gen).requires_grad_()
    sinks_H = torch.randn(HEADS, generator=gen) * 2 if sinks else None
    grad_out = torch.randn(rows, HEADS * HEAD_DIM, generator=gen)
    real = batch.row_index()

    def grads(out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = out.index_select(0, real)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out.index_select(0, real)))

    want = grads(eager_window_sinks(q, k, v, list(batch.seq_row_start), lengths, window,
                                    sinks_H))
    assert batch.num_scratch_blocks is not None
    pages = [scratch_pages(batch.num_scratch_blocks, 64, batch.write_block_W,
                           batch.write_offset_W, x.index_select(0, batch.write_rows_W))
             for x in (k, v)]
    extras = AttentionExtras.of(batch.positions_R, HEADS, 64, window, sinks_H)
    got = grads(tiled_paged_attention(q, pages[0], pages[1], batch.tiles, extras=extras))
    for g, w in zip(got, want, strict=True):
        assert (g - w).abs().max().item() <= 2e-5
    if window is not None and not sinks:
        dense = dense_attention(q, pages[0], pages[1], batch, KV_HEADS, window)
        assert (dense.index_select(0, real) - want[0]).abs().max().item() <= 2e-5
    # the window matters: without it the long sequences' outputs differ
    plain = tiled_paged_attention(q.detach(), pages[0].detach(), pages[1].detach(), batch.tiles,
                                  extras=AttentionExtras.of(batch.positions_R, HEADS, 64, None,
                                                            sinks_H))
    if window is not None:
        assert (plain.index_select(0, real) - want[0]).abs().max().item() > 1e-3
