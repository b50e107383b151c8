"""Causal attention over a paged KV layout: the batch-invariant tiled kernel and a fast one.

`tiled_paged_attention` (batch-invariant mode) runs every query tile against fixed 64-key
blocks visited in one sequential order with an online softmax. Every matmul has a fixed
per-matrix shape (``[groups·tile, head_dim] × [head_dim, block]`` and ``[groups·tile, block] ×
[block, head_dim]``), every reduction is row-local over one block, and a block a row cannot see
is an exact no-op (its max is -inf, so alpha = exp(0) = 1 and it adds exactly 0). A query's
result therefore depends only on its own position's keys, never on the batch around it,
whether it came from a full forward, a prefill or a one-token decode step.

`dense_attention` (fast mode) gathers each sequence's pages into a dense padded key range and
calls SDPA once: correct, cheaper per decode step, and not batch-invariant.
Both take keys/values already written to pages; neither knows about LoRA or weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from loraplex.engine.model.packed_batch import PackedBatch, TilePlan


def tiled_paged_attention(q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                          plan: TilePlan, num_kv_heads: int) -> torch.Tensor:
    """Attention output ``[rows, heads·head_dim]`` for scaled queries.

    Args:
        q_R_H_D: queries of every row, already multiplied by ``head_dim ** -0.5``.
        k_pages, v_pages: ``[blocks, kv_heads, block_size, head_dim]`` pages with this batch's
            keys/values written.
        plan: the batch's tile plan (sorted tiles, limits, per-tile block tables).
    """
    _, num_heads, head_dim = q_R_H_D.shape
    groups = num_heads // num_kv_heads
    num_tiles, tile = plan.rows_N_T.shape
    # Gather queries into tiles: [N, T, Hkv, g, D] -> [N, Hkv, g·T, D]; pad slots read row R (0s).
    q_pad = torch.cat([q_R_H_D, q_R_H_D.new_zeros(1, num_heads, head_dim)])
    q_tiles = (q_pad.index_select(0, plan.rows_N_T.flatten())
               .view(num_tiles, tile, num_kv_heads, groups, head_dim)
               .permute(0, 2, 3, 1, 4).reshape(num_tiles, num_kv_heads, groups * tile, head_dim))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q_tiles, k_pages, v_pages)):
        out = _TiledAttention.apply(q_tiles, k_pages, v_pages, plan, tile)
    else:
        out, _ = _tiles_forward(q_tiles, k_pages, v_pages, plan, tile)
    out = (out.view(num_tiles, num_kv_heads, groups, tile, head_dim).permute(0, 3, 1, 2, 4)
           .reshape(num_tiles * tile, num_heads * head_dim))
    out = torch.cat([out, out.new_zeros(1, num_heads * head_dim)])
    return out.index_select(0, plan.slot_of_row_R)


def _block_scores(q: torch.Tensor, k: torch.Tensor, b: int, limits_n_T: torch.Tensor,
                  tile: int) -> torch.Tensor:
    """Masked scores ``[n, Hkv, g·T, block]`` of KV block ``b`` (-inf where not visible)."""
    n, kv_heads, rows, _ = q.shape
    block = k.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2))
    key_pos = b * block + torch.arange(block, device=q.device)
    visible = key_pos < limits_n_T[:, :, None]  # [n, T, block]
    return (scores.view(n, kv_heads, rows // tile, tile, block)
            .masked_fill(~visible[:, None, None], float("-inf")).view(n, kv_heads, rows, block))


def _gather(pages: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    return pages.index_select(0, blocks).contiguous()


def _tiles_forward(q_tiles: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                   plan: TilePlan, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Online softmax over KV blocks (the algorithm): ``out [N, Hkv, g·T, D]`` and the
    log-sum-exp of every query row (for the backward)."""
    finished: list[tuple[torch.Tensor, torch.Tensor]] = []
    m = l_sum = acc = q_tiles  # rebound at b == 0; typed placeholders
    for b, n in enumerate(plan.active_tiles):
        if b > 0 and n < acc.shape[0]:  # tiles [n:] need no further block: normalise and park
            finished.append((acc[n:] / l_sum[n:, :, :, None], m[n:] + torch.log(l_sum[n:])))
            m, l_sum, acc = m[:n], l_sum[:n], acc[:n]
        blocks = plan.block_table_N_B[:n, b]
        v = _gather(v_pages, blocks)
        scores = _block_scores(q_tiles[:n], _gather(k_pages, blocks), b, plan.limits_N_T[:n],
                               tile)
        block_max = scores.amax(-1)
        if b == 0:  # key 0 is visible to every row, so the first max is finite
            m = block_max
            p = torch.exp(scores - m[..., None])
            l_sum = p.sum(-1)
            acc = torch.matmul(p, v)
        else:  # a block a row cannot see is an exact no-op: alpha = 1, p = 0
            m_new = torch.maximum(m, block_max)
            alpha = torch.exp(m - m_new)
            p = torch.exp(scores - m_new[..., None])
            l_sum = l_sum * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.matmul(p, v)
            m = m_new
    finished.append((acc / l_sum[..., None], m + torch.log(l_sum)))
    return torch.cat([o for o, _ in finished[::-1]]), torch.cat([s for _, s in finished[::-1]])


class _TiledAttention(torch.autograd.Function):
    """The tiled forward with a FlashAttention-2 style backward: probabilities are recomputed
    per KV block from the saved log-sum-exp instead of being stored (less memory, fewer ops).
    Only the forward must be batch-invariant; the backward just has to be right."""

    @staticmethod
    def forward(ctx: Any, q_tiles: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                plan: TilePlan, tile: int) -> torch.Tensor:
        out, lse = _tiles_forward(q_tiles, k_pages, v_pages, plan, tile)
        ctx.save_for_backward(q_tiles, k_pages, v_pages, out, lse)
        ctx.plan, ctx.tile = plan, tile
        return out

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k_pages, v_pages, out, lse = ctx.saved_tensors
        plan: TilePlan = ctx.plan
        d_out = d_out.contiguous()
        delta = (d_out * out).sum(-1, keepdim=True)  # rowsum(dO ∘ O) = Σ_j P_ij dP_ij
        d_q = torch.zeros_like(q)
        d_k, d_v = torch.zeros_like(k_pages), torch.zeros_like(v_pages)
        for b, n in enumerate(plan.active_tiles):
            blocks = plan.block_table_N_B[:n, b]
            k, v = _gather(k_pages, blocks), _gather(v_pages, blocks)
            p = torch.exp(_block_scores(q[:n], k, b, plan.limits_N_T[:n], ctx.tile)
                          - lse[:n, ..., None])
            d_v.index_add_(0, blocks, torch.matmul(p.transpose(-1, -2), d_out[:n]))
            d_s = p * (torch.matmul(d_out[:n], v.transpose(-1, -2)) - delta[:n])
            d_q[:n] += torch.matmul(d_s, k)
            d_k.index_add_(0, blocks, torch.matmul(d_s.transpose(-1, -2), q[:n]))
        return d_q, d_k, d_v, None, None


def dense_attention(q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                    batch: PackedBatch, num_kv_heads: int) -> torch.Tensor:
    """Fast-mode attention: one SDPA call over per-sequence padded key ranges.

    Same inputs and output as `tiled_paged_attention` (queries pre-scaled); pads each
    sequence's queries to the longest new-token count and keys to the widest block table.
    """
    num_rows, num_heads, head_dim = q_R_H_D.shape
    device = q_R_H_D.device
    num_seqs, width = batch.block_tables_S_B.shape
    block = k_pages.shape[2]
    q_len = max(batch.seq_num_new)
    starts = torch.tensor(batch.seq_row_start, device=device)
    num_new = torch.tensor(batch.seq_num_new, device=device)
    cached = torch.tensor(batch.seq_num_cached, device=device)
    j = torch.arange(q_len, device=device)
    is_real = j[None, :] < num_new[:, None]  # [S, Lq]
    q_idx = torch.where(is_real, starts[:, None] + j[None, :], num_rows)
    q_pad = torch.cat([q_R_H_D, q_R_H_D.new_zeros(1, num_heads, head_dim)])
    q = q_pad[q_idx].transpose(1, 2)  # [S, H, Lq, D]

    def dense(pages: torch.Tensor) -> torch.Tensor:
        gathered = pages[batch.block_tables_S_B]  # [S, B, Hkv, block, D]
        return gathered.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, width * block,
                                                       head_dim)

    keys = torch.arange(width * block, device=device)
    limit = torch.where(is_real, cached[:, None] + j[None, :] + 1, 1)  # pad queries see key 0
    mask = keys[None, None, :] < limit[:, :, None]  # [S, Lq, K]
    out = F.scaled_dot_product_attention(q, dense(k_pages), dense(v_pages),
                                         attn_mask=mask[:, None], scale=1.0,
                                         enable_gqa=num_heads != num_kv_heads)
    out = out.transpose(1, 2).reshape(num_seqs * q_len, num_heads * head_dim)
    out = torch.cat([out, out.new_zeros(1, num_heads * head_dim)])
    rows = torch.full((num_rows,), num_seqs * q_len, dtype=torch.long, device=device)
    seq_of = torch.arange(num_seqs, device=device)[:, None].expand(num_seqs, q_len)
    rows = rows.index_put((q_idx[is_real],), (seq_of * q_len + j[None, :])[is_real])
    return out[rows]
