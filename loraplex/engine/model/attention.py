"""Causal attention over a paged KV layout: the batch-invariant tiled kernel and a fast one.

`tiled_paged_attention` runs the `TilePlan`'s tiles against fixed ``block_size``-key pages,
KV step by KV step, with an online softmax whose state (running max, sum, accumulator) stays in
a phase's tile layout across its steps and moves with its row when tiles regroup. Every matmul
has a fixed per-matrix shape (``[rows, head_dim] × [head_dim, block]`` and ``[rows, block] × [block,
head_dim]``, rows a multiple of 4), every other op is row-local (the reductions run over one
block), and each row sees its blocks in the order 0, 1, 2, ...: a query's result depends only
on its own position's keys, never on the batch around it, on which rows share its tile, or on
whether it came from a full forward, a prefill or a one-token decode step.

Given the C kernel (`engine.kernels.attention_kernel`, chosen at load for a CPU float32
model), `tiled_paged_attention` runs its forward instead: batch-invariant by construction
(each query row alone, in a fixed order), one call per layer; and its backward, unless the
batch's sequences share pages or are too few to give every thread an item (then the tiles'
backward below, fed with the kernel's log-sum-exp). A model uses one forward or the other
everywhere, so training, prefill and decode agree bit for bit either way.

Two extensions, the tiles' only (`AttentionExtras`, gpt-oss): a sliding window (a query at
position p sees keys p - window + 1 .. p; a key block is masked by position, row by row, so a
block wholly outside a row's window is an exact no-op for it) and attention sinks (a learned
logit per query head in every softmax denominator: each row's softmax state starts as the
sink, m = sink, l = 1, acc = 0, so no row ever starts from a fully masked block).

`dense_attention` (fast mode on CUDA) gathers each sequence's pages into a dense padded key
range and calls SDPA once: correct, and not batch-invariant.
Both take keys/values already written to pages; neither knows about LoRA or weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from loraplex.engine.kernels.attention_kernel import AttentionKernel, AttentionRuns
from loraplex.engine.model.packed_batch import PackedBatch
from loraplex.engine.model.tile_plan import TilePhase, TilePlan, TileStep


@dataclass(frozen=True)
class AttentionExtras:
    """A window and sinks for the tiles (see the module docstring), per query row.

    Attributes:
        window: keys visible to a query: its own and the ``window - 1`` before it; None: all.
        positions_A: every query row's position (rows × heads, then the zero row: 0).
        sinks_A: every query row's sink logit (its head's); None: no sinks.
        block_size: keys per page (a step's keys are ``block·size + 0 .. size-1``).
    """

    window: int | None
    positions_A: torch.Tensor
    sinks_A: torch.Tensor | None
    block_size: int

    @staticmethod
    def of(positions_R: torch.Tensor, num_heads: int, block_size: int, window: int | None,
           sinks_H: torch.Tensor | None) -> AttentionExtras | None:
        """The extras of a batch's rows (None when there is neither window nor sinks)."""
        if window is None and sinks_H is None:
            return None
        rows = positions_R.shape[0]
        positions_A = torch.cat([positions_R.repeat_interleave(num_heads),
                                 positions_R.new_zeros(1)])
        sinks_A = None if sinks_H is None else torch.cat([
            sinks_H.float().repeat(rows), sinks_H.new_zeros(1, dtype=torch.float32)])
        return AttentionExtras(window, positions_A, sinks_A, block_size)

    def window_mask(self, phase: TilePhase, step_index: int, num_tiles: int
                    ) -> torch.Tensor | None:
        """``[N, kv_heads, rows, block]``: True where a key is older than the row's window."""
        if self.window is None:
            return None
        q_pos = self.positions_A.index_select(0, phase.index_P).view(phase.shape)[:num_tiles]
        first_key = (phase.first_step + step_index) * self.block_size
        k_pos = torch.arange(first_key, first_key + self.block_size, device=q_pos.device)
        return (q_pos[..., None] - k_pos) >= self.window

    def initial_state(self, phase: TilePhase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The softmax state rows start from: the sink (m = sink, l = 1), else m = -inf,
        l = 0 (a row may see no key of its first block)."""
        shape = phase.shape
        if self.sinks_A is not None:
            m = self.sinks_A.index_select(0, phase.index_P).view(shape)
            return m, torch.ones_like(m), m.new_zeros(*shape, 0)
        m = self.positions_A.new_full(shape, float("-inf"), dtype=torch.float32)
        return m, torch.zeros_like(m), m.new_zeros(*shape, 0)


def tiled_paged_attention(q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                          plan: TilePlan, kernel: AttentionKernel | None = None,
                          runs: AttentionRuns | None = None,
                          extras: AttentionExtras | None = None) -> torch.Tensor:
    """Attention output ``[rows, heads·head_dim]`` for scaled queries.

    Args:
        q_R_H_D: queries of every row, already multiplied by ``head_dim ** -0.5``.
        k_pages, v_pages: ``[blocks, kv_heads, block_size, head_dim]`` pages with this batch's
            keys/values written.
        plan: the batch's tile plan. Rows no tile reads (row padding) get zeros.
        kernel, runs: the C kernel and the batch's `AttentionRuns`: its forward instead of
            the tiles', and its backward where `AttentionKernel.backward_fits`.
        extras: a window and sinks (the tiles only: not with ``kernel``).
    """
    rows, heads, head_dim = q_R_H_D.shape
    assert rows * heads == plan.num_query_rows
    assert extras is None or kernel is None, "the C kernel has no window nor sinks"
    native = None if kernel is None or runs is None else _Native(kernel, runs, heads)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q_R_H_D, k_pages, v_pages)):
        q_A_D = _with_zero_row(q_R_H_D.reshape(rows * heads, head_dim))
        out_A_D = _TiledAttention.apply(q_A_D, k_pages, v_pages, plan, native, extras)
        return out_A_D[:-1].view(rows, heads * head_dim)
    if native is not None:
        return native.kernel.forward(q_R_H_D, k_pages, v_pages, native.runs)[0]
    q_A_D = _with_zero_row(q_R_H_D.reshape(rows * heads, head_dim))
    carries = any(phase.first_step > 0 for phase in plan.phases)
    out_A_D = _tiles_forward(q_A_D, k_pages, v_pages, plan, keep_state=carries,
                             extras=extras).output()
    return out_A_D[:-1].view(rows, heads * head_dim)


def _with_zero_row(x_N_D: torch.Tensor) -> torch.Tensor:
    """``x`` and one zero row after it (the row tile padding points at)."""
    return torch.cat([x_N_D, x_N_D.new_zeros(1, x_N_D.shape[1])])


class _Native:
    """The C kernel's forward in the tiles' ``[A, D]`` layout (query rows × heads, then the
    zero row), for `_TiledAttention`."""

    def __init__(self, kernel: AttentionKernel, runs: AttentionRuns, heads: int) -> None:
        self.kernel, self.runs, self.heads = kernel, runs, heads

    def forward(self, q_A_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Output ``[A, D]`` and log-sum-exp ``[A]`` (zeros on the zero row)."""
        head_dim = q_A_D.shape[1]
        q_R_H_D = q_A_D[:-1].view(-1, self.heads, head_dim)
        out, lse = self.kernel.forward(q_R_H_D, k_pages, v_pages, self.runs)
        return (_with_zero_row(out.view(-1, head_dim)),
                torch.cat([lse.view(-1), lse.new_zeros(1)]))

    def backward(self, q_A_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 d_out_A_D: torch.Tensor, lse_A: torch.Tensor, delta_A: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients of ``q`` (``[A, D]``, zero on the zero row) and of the pages."""
        head_dim = q_A_D.shape[1]

        def rows(x_A: torch.Tensor) -> torch.Tensor:
            return x_A[:-1].view(-1, self.heads, *x_A.shape[1:])

        d_q, d_k, d_v = self.kernel.backward(rows(q_A_D), k_pages, v_pages, rows(d_out_A_D),
                                             rows(lse_A), rows(delta_A), self.runs)
        return _with_zero_row(d_q.view(-1, head_dim)), d_k, d_v


def _read(pages: torch.Tensor, step: TileStep) -> torch.Tensor:
    """``[N, kv_heads, block, head_dim]``: the step's pages (a view when consecutive)."""
    if step.page_range is not None:
        return pages[step.page_range[0]:step.page_range[1]]
    return pages.index_select(0, step.pages_N)


def _scores(q_t: torch.Tensor, k_t: torch.Tensor, step: TileStep,
            window_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scores ``[N, kv_heads, rows, block]`` with -inf where a key is not visible (after the
    row, or before its window)."""
    s = torch.matmul(q_t, k_t.transpose(-1, -2))
    mask = step.mask_M_1_R_B
    if mask is not None:
        s[s.shape[0] - mask.shape[0]:].masked_fill_(mask, float("-inf"))
    if window_mask is not None:
        s.masked_fill_(window_mask, float("-inf"))
    return s


class _SoftmaxState:
    """Every query row's running max ``m``, sum ``l`` and accumulator, in row layout. A phase
    takes its rows' state in tile layout and puts it back as its tiles finish. Rows start at
    m = 0, l = 1, acc = 0, so a row no tile reads comes out as zeros.

    Without ``keep_state`` (inference, every phase starting at step 0: no row's state carries
    over) a finished tile stores just its output ``acc / l`` (the same division, in tile
    layout), and there is no log-sum-exp."""

    def __init__(self, q_A_D: torch.Tensor, keep_state: bool = True) -> None:
        num_q, head_dim = q_A_D.shape
        self.keep_state = keep_state
        self.acc_A_D = q_A_D.new_zeros(num_q, head_dim)
        if keep_state:
            self.m_A = q_A_D.new_zeros(num_q)
            self.l_A = q_A_D.new_ones(num_q)

    def take(self, phase: TilePhase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx, shape = phase.index_P, phase.shape
        return (self.m_A.index_select(0, idx).view(shape),
                self.l_A.index_select(0, idx).view(shape),
                self.acc_A_D.index_select(0, idx).view(*shape, -1))

    def put(self, phase: TilePhase, first_tile: int, m: torch.Tensor, l_sum: torch.Tensor,
            acc: torch.Tensor) -> None:
        """Store the state of tiles ``first_tile ..`` of the phase (``m`` etc. hold those)."""
        rows = phase.shape[1] * phase.shape[2]
        idx = phase.index_P[first_tile * rows:(first_tile + m.shape[0]) * rows]
        if not self.keep_state:  # acc_A_D holds outputs
            self.acc_A_D.index_copy_(0, idx, (acc / l_sum[..., None]).reshape(-1, acc.shape[-1]))
            return
        self.m_A.index_copy_(0, idx, m.reshape(-1))
        self.l_A.index_copy_(0, idx, l_sum.reshape(-1))
        self.acc_A_D.index_copy_(0, idx, acc.reshape(-1, acc.shape[-1]))

    def output(self) -> torch.Tensor:
        """The attention output of every row, ``[A, D]``."""
        return self.acc_A_D / self.l_A[:, None] if self.keep_state else self.acc_A_D

    def log_sum_exp(self) -> torch.Tensor:
        """Every row's log-sum-exp of its scores, ``[A]`` (for the backward)."""
        return self.m_A + torch.log(self.l_A)


def _tiles_forward(q_A_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                   plan: TilePlan, keep_state: bool = True,
                   extras: AttentionExtras | None = None) -> _SoftmaxState:
    """Online softmax over KV steps (the algorithm): the final state of every query row (its
    output, and its log-sum-exp for the backward)."""
    state = _SoftmaxState(q_A_D, keep_state)
    head_dim = q_A_D.shape[1]
    for phase in plan.phases:
        q_t = q_A_D.index_select(0, phase.index_P).view(*phase.shape, head_dim)
        if phase.first_step > 0:
            m, l_sum, acc = state.take(phase)
        elif extras is not None:
            m, l_sum, acc = extras.initial_state(phase)
            acc = acc.new_zeros(*phase.shape, head_dim)
        for j, step in enumerate(phase.steps):
            n = step.num_tiles
            if j > 0 and n < m.shape[0]:  # tiles [n:] are done: their rows' state goes back
                state.put(phase, n, m[n:], l_sum[n:], acc[n:])
                m, l_sum, acc = m[:n], l_sum[:n], acc[:n]
            window = None if extras is None else extras.window_mask(phase, j, n)
            s = _scores(q_t[:n], _read(k_pages, step), step, window)
            v_t = _read(v_pages, step)
            block_max = s.amax(-1)
            if phase.first_step + j == 0 and extras is None:  # key 0 is visible: a finite max
                m = block_max
                p = torch.exp(s - m[..., None])
                l_sum = p.sum(-1)
                acc = torch.matmul(p, v_t)
            else:  # a block a row cannot see would be an exact no-op: alpha = 1, p = 0
                m_new = torch.maximum(m, block_max)
                # -inf only while a row has seen no key and no sink: exp(-inf - 0) = 0
                shift = m_new if extras is None else torch.where(m_new.isinf(), 0.0, m_new)
                alpha = torch.exp(m - shift)
                p = torch.exp(s - shift[..., None])
                l_sum = l_sum * alpha + p.sum(-1)
                acc = acc * alpha[..., None] + torch.matmul(p, v_t)
                m = m_new
        state.put(phase, 0, m, l_sum, acc)
    return state


class _TiledAttention(torch.autograd.Function):
    """The tiled forward with a FlashAttention-2 style backward: probabilities are recomputed
    per tile from the saved log-sum-exp instead of being stored (less memory, fewer ops).
    Only the forward must be batch-invariant; the backward just has to be right."""

    @staticmethod
    def forward(ctx: Any, q_A_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                plan: TilePlan, native: _Native | None, extras: AttentionExtras | None
                ) -> torch.Tensor:
        if native is not None:
            out, lse = native.forward(q_A_D, k_pages, v_pages)
        else:
            state = _tiles_forward(q_A_D, k_pages, v_pages, plan, extras=extras)
            out, lse = state.output(), state.log_sum_exp()
        ctx.save_for_backward(q_A_D, k_pages, v_pages, out, lse)
        ctx.plan, ctx.native, ctx.extras = plan, native, extras
        return out

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q_A_D, k_pages, v_pages, out, lse = ctx.saved_tensors
        d_out = d_out.contiguous()
        delta_A = (d_out * out).sum(-1)  # rowsum(dO ∘ O) = Σ_j P_ij dP_ij
        native: _Native | None = ctx.native
        if native is not None and native.kernel.backward_fits(native.runs, k_pages.shape[1],
                                                              k_pages.shape[2]):
            return (*native.backward(q_A_D, k_pages, v_pages, d_out, lse, delta_A), None, None,
                    None)
        plan: TilePlan = ctx.plan
        extras: AttentionExtras | None = ctx.extras
        head_dim = q_A_D.shape[1]
        d_q = torch.zeros_like(q_A_D)
        d_k, d_v = torch.zeros_like(k_pages), torch.zeros_like(v_pages)
        for phase in plan.phases:
            idx, shape = phase.index_P, phase.shape
            q_t = q_A_D.index_select(0, idx).view(*shape, head_dim)
            d_o = d_out.index_select(0, idx).view(*shape, head_dim)
            lse_t = lse.index_select(0, idx).view(*shape, 1)
            delta_t = delta_A.index_select(0, idx).view(*shape, 1)
            d_q_t = torch.zeros_like(q_t)
            for j, step in enumerate(phase.steps):
                n = step.num_tiles
                k_t, v_t = _read(k_pages, step), _read(v_pages, step)
                window = None if extras is None else extras.window_mask(phase, j, n)
                p = torch.exp(_scores(q_t[:n], k_t, step, window) - lse_t[:n])
                d_v.index_add_(0, step.pages_N, torch.matmul(p.transpose(-1, -2), d_o[:n]))
                d_s = p * (torch.matmul(d_o[:n], v_t.transpose(-1, -2)) - delta_t[:n])
                d_q_t[:n] += torch.matmul(d_s, k_t)
                d_k.index_add_(0, step.pages_N, torch.matmul(d_s.transpose(-1, -2), q_t[:n]))
            d_q.index_add_(0, idx, d_q_t.view(-1, head_dim))
        return d_q, d_k, d_v, None, None, None


def dense_attention(q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                    batch: PackedBatch, num_kv_heads: int, window: int | None = None
                    ) -> torch.Tensor:
    """Fast-mode attention on CUDA: one SDPA call over per-sequence padded key ranges.

    Same inputs and output as `tiled_paged_attention` (queries pre-scaled); pads each
    sequence's queries to the longest new-token count and its keys to the longest key range
    with zeros (masked). Only the pages holding a sequence's keys are read.
    """
    num_rows, num_heads, head_dim = q_R_H_D.shape
    device = q_R_H_D.device
    num_seqs = batch.num_sequences
    block = k_pages.shape[2]
    q_len = max(batch.seq_num_new)
    num_keys = [c + n for c, n in zip(batch.seq_num_cached, batch.seq_num_new, strict=True)]
    used = [-(-n // block) for n in num_keys]
    width = max(used)
    slots = [(i, j) for i, n in enumerate(used) for j in range(n)]  # N: the pages read
    seq_N = torch.tensor([i for i, _ in slots], device=device)
    slot_N = torch.tensor([j for _, j in slots], device=device)
    page_N = batch.block_tables_B_N[seq_N, slot_N]
    starts = torch.tensor(batch.seq_row_start, device=device)
    num_new = torch.tensor(batch.seq_num_new, device=device)
    cached = torch.tensor(batch.seq_num_cached, device=device)
    j = torch.arange(q_len, device=device)
    is_real = j[None, :] < num_new[:, None]  # [B, Lq]
    q_idx = torch.where(is_real, starts[:, None] + j[None, :], num_rows)
    q_pad = torch.cat([q_R_H_D, q_R_H_D.new_zeros(1, num_heads, head_dim)])
    q = q_pad[q_idx].transpose(1, 2)  # [B, H, Lq, D]

    def dense(pages: torch.Tensor) -> torch.Tensor:
        out = pages.new_zeros(num_seqs, width, *pages.shape[1:])  # [B, width, Hkv, block, D]
        out = out.index_put((seq_N, slot_N), pages.index_select(0, page_N))
        return out.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, width * block,
                                                  head_dim)

    keys = torch.arange(width * block, device=device)
    limit = torch.where(is_real, cached[:, None] + j[None, :] + 1, 1)  # pad queries see key 0
    mask = keys[None, None, :] < limit[:, :, None]  # [B, Lq, keys]
    if window is not None:  # a key older than the query's window: limit - 1 - key >= window
        mask &= (limit[:, :, None] - 1 - keys[None, None, :]) < window
    out = F.scaled_dot_product_attention(q, dense(k_pages), dense(v_pages),
                                         attn_mask=mask[:, None], scale=1.0,
                                         enable_gqa=num_heads != num_kv_heads)
    out = out.transpose(1, 2).reshape(num_seqs * q_len, num_heads * head_dim)
    out = torch.cat([out, out.new_zeros(1, num_heads * head_dim)])
    rows = torch.full((num_rows,), num_seqs * q_len, dtype=torch.long, device=device)
    seq_of = torch.arange(num_seqs, device=device)[:, None].expand(num_seqs, q_len)
    rows = rows.index_put((q_idx[is_real],), (seq_of * q_len + j[None, :])[is_real])
    return out[rows]
