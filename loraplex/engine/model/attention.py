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

import torch
import torch.nn.functional as F

from loraplex.engine.model.packed_batch import PackedBatch, TilePlan


def tiled_paged_attention(q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                          plan: TilePlan, num_kv_heads: int) -> torch.Tensor:
    """Attention output ``[rows, heads·head_dim]`` for scaled queries (the algorithm).

    Args:
        q_R_H_D: queries of every row, already multiplied by ``head_dim ** -0.5``.
        k_pages, v_pages: ``[blocks, kv_heads, block_size, head_dim]`` pages with this batch's
            keys/values written.
        plan: the batch's tile plan (sorted tiles, limits, per-tile block tables).
    """
    _, num_heads, head_dim = q_R_H_D.shape
    groups = num_heads // num_kv_heads
    num_tiles, tile = plan.rows_N_T.shape
    block = k_pages.shape[2]
    gt = groups * tile

    # Gather queries into tiles: [N, T, Hkv, g, D] -> [N, Hkv, g·T, D]; pad slots read row R (0s).
    q_pad = torch.cat([q_R_H_D, q_R_H_D.new_zeros(1, num_heads, head_dim)])
    q_tiles = (q_pad[plan.rows_N_T].view(num_tiles, tile, num_kv_heads, groups, head_dim)
               .permute(0, 2, 3, 1, 4).reshape(num_tiles, num_kv_heads, gt, head_dim))
    key_offsets = torch.arange(block, device=q_R_H_D.device)

    finished: list[torch.Tensor] = []
    m = l_sum = acc = q_tiles  # rebound at b == 0; typed placeholders
    for b, n in enumerate(plan.active_tiles):
        if b > 0 and n < acc.shape[0]:  # tiles [n:] need no further block: normalise and park
            finished.append(acc[n:] / l_sum[n:, :, :, None])
            m, l_sum, acc = m[:n], l_sum[:n], acc[:n]
        blocks = plan.block_table_N_B[:n, b]
        k = k_pages.index_select(0, blocks).contiguous()
        v = v_pages.index_select(0, blocks).contiguous()
        scores = torch.matmul(q_tiles[:n], k.transpose(-1, -2))  # [n, Hkv, g·T, block]
        visible = (b * block + key_offsets) < plan.limits_N_T[:n, :, None]  # [n, T, block]
        scores = (scores.view(n, num_kv_heads, groups, tile, block)
                  .masked_fill(~visible[:, None, None], float("-inf"))
                  .view(n, num_kv_heads, gt, block))
        block_max = scores.amax(-1)
        if b == 0:  # key 0 is visible to every row, so the first max is finite
            m = block_max
            p = torch.exp(scores - m[..., None])
            l_sum = p.sum(-1)
            acc = torch.matmul(p, v)
        else:
            m_new = torch.maximum(m, block_max)
            alpha = torch.exp(m - m_new)
            p = torch.exp(scores - m_new[..., None])
            l_sum = l_sum * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.matmul(p, v)
            m = m_new
    finished.append(acc / l_sum[..., None])
    out = torch.cat(finished[::-1])  # tiles back in plan order
    out = (out.view(num_tiles, num_kv_heads, groups, tile, head_dim).permute(0, 3, 1, 2, 4)
           .reshape(num_tiles * tile, num_heads * head_dim))
    out = torch.cat([out, out.new_zeros(1, num_heads * head_dim)])
    return out[plan.slot_of_row_R]


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
