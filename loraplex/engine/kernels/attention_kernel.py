"""`AttentionKernel`: the paged attention forward in C (``paged_attention.c``), and
`AttentionRuns`, the row layout it reads.

The tiled torch kernel (`model.attention`) gets batch invariance from fixed-shape MKL tiles and
pays for it in small ops: a 32-sequence decode step spent ~35 ms of its ~150 ms in ~50 ops per
layer on tiles of 4 rows. The C kernel computes each query row alone in a fixed order (see the
source), so it is batch-invariant by construction, and runs a decode step's attention, a
prefill's or a training forward's in one call per layer. Every forward of a model goes
through one of the two (chosen at load), so a token's logprob is the same bits in training,
prefill and decode either way. Its backward (``paged_attention_backward.h``, FlashAttention-2's,
fed with this forward's log-sum-exp) runs per (sequence, kv head), in a fixed order; a batch
whose sequences share pages (never one the trainer builds) takes the tiled torch backward.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.engine.kernels import native_library

#: Most rows of one run (rows of one sequence that share the transposed keys of a page).
RUN_ROWS = 16
#: The source's limits: query heads per KV head, head dim and page size.
MAX_GROUP, MAX_DIM, MAX_BLOCK = 16, 256, 256


@dataclass(frozen=True)
class AttentionRuns:
    """A packed batch's query rows as the kernel reads them.

    Attributes:
        tables_B_N: int64 block tables, one row per sequence (contiguous).
        run_row_U, run_len_U, run_table_U: per run, its first row, its rows (≤ `RUN_ROWS`,
            consecutive rows of one sequence) and the flat offset of its sequence's table.
        row_keys_R: keys each row sees (its position + 1; 0 for padding rows).
        seq_row_S, seq_len_S, seq_table_S: per sequence with new rows (most work first: the
            backward's items), its first row, its rows and the flat offset of its table.
        seq_keys_S: keys its last row sees.
    """

    tables_B_N: torch.Tensor
    run_row_U: torch.Tensor
    run_len_U: torch.Tensor
    run_table_U: torch.Tensor
    row_keys_R: torch.Tensor
    seq_row_S: torch.Tensor
    seq_len_S: torch.Tensor
    seq_table_S: torch.Tensor
    seq_keys_S: torch.Tensor

    @staticmethod
    def of(num_rows: int, seq_row_start: Sequence[int], seq_num_new: Sequence[int],
           seq_num_cached: Sequence[int], tables_B_N: torch.Tensor) -> AttentionRuns:
        """Runs of every sequence's new rows (``RUN_ROWS`` at a time)."""
        width = tables_B_N.shape[1]
        run_row, run_len, run_table = [], [], []
        row_keys = [0] * num_rows
        for i, (start, new, cached) in enumerate(
                zip(seq_row_start, seq_num_new, seq_num_cached, strict=True)):
            row_keys[start:start + new] = range(cached + 1, cached + new + 1)
            for offset in range(0, new, RUN_ROWS):
                run_row.append(start + offset)
                run_len.append(min(RUN_ROWS, new - offset))
                run_table.append(i * width)

        triples = zip(seq_row_start, seq_num_new, seq_num_cached, strict=True)
        seqs = sorted(((start, new, i * width, cached + new)
                       for i, (start, new, cached) in enumerate(triples) if new),
                      key=lambda seq: -seq[1] * seq[3])  # work ~ rows × keys

        def tensor(values: Sequence[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        columns = [tensor([seq[c] for seq in seqs]) for c in range(4)]
        return AttentionRuns(tables_B_N.to("cpu", torch.int64).contiguous(), tensor(run_row),
                             tensor(run_len), tensor(run_table), tensor(row_keys), *columns)

    def pages_disjoint(self, block_size: int) -> bool:
        """Whether no page holds keys of two sequences (the backward's items then write
        disjoint pages)."""
        flat = self.tables_B_N.view(-1)
        used = [flat[t:t + -(-k // block_size)] for t, k in
                zip(self.seq_table_S.tolist(), self.seq_keys_S.tolist(), strict=True)]
        pages = torch.cat(used) if used else flat[:0]
        return bool(pages.unique().numel() == pages.numel())


def _bounds(rows: int, runs: AttentionRuns, pages: torch.Tensor) -> tuple[ctypes.c_int64, ...]:
    """What the kernel checks every row, table offset and page id against: the query rows,
    the tables' rows and width, and the pages (int64 tables and keys, as it reads them)."""
    for name in ("tables_B_N", "run_row_U", "run_len_U", "run_table_U", "row_keys_R",
                 "seq_row_S", "seq_len_S", "seq_table_S"):
        t = getattr(runs, name)
        if t.dtype != torch.int64 or not t.is_contiguous():
            raise ValueError(f"attention kernel: {name} must be contiguous int64")
    if runs.row_keys_R.numel() < rows:
        raise ValueError(f"attention kernel: {runs.row_keys_R.numel()} row keys for {rows} rows")
    table_rows, width = (runs.tables_B_N.shape if runs.tables_B_N.ndim == 2
                         else (1, runs.tables_B_N.numel()))
    i64 = ctypes.c_int64
    return i64(rows), i64(table_rows), i64(width), i64(pages.shape[0])


@dataclass(frozen=True)
class AttentionKernel:
    """The loaded ``paged_attention.c``.

    Attributes:
        library: its ctypes handle.
        lanes: floats per vector (16 with AVX-512, 8 with AVX2).
    """

    library: ctypes.CDLL
    lanes: int

    def supports(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 block_size: int) -> bool:
        """Whether the kernel takes this model's attention shape (else the tiled kernel)."""
        return (num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= MAX_GROUP
                and head_dim % self.lanes == 0 and head_dim <= MAX_DIM
                and block_size % self.lanes == 0 and block_size <= MAX_BLOCK)

    def forward(self, q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                runs: AttentionRuns) -> tuple[torch.Tensor, torch.Tensor]:
        """Output ``[R, H·D]`` and log-sum-exp ``[R, H]`` of scaled queries ``q`` over pages
        ``[blocks, kv_heads, block_size, head_dim]`` (fp32, CPU; no autograd)."""
        q = q_R_H_D.detach().contiguous()
        k = k_pages.detach().contiguous()
        v = v_pages.detach().contiguous()
        rows, heads, head_dim = q.shape
        out = torch.zeros(rows, heads, head_dim)  # padding rows belong to no run: zeros
        lse = torch.zeros(rows, heads)
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        status = self.library.la_forward(
            ptr(q.data_ptr()), ptr(k.data_ptr()), ptr(v.data_ptr()),
            ptr(runs.tables_B_N.data_ptr()), ptr(runs.run_row_U.data_ptr()),
            ptr(runs.run_len_U.data_ptr()), ptr(runs.run_table_U.data_ptr()),
            ptr(runs.row_keys_R.data_ptr()), i64(runs.run_row_U.numel()), i64(heads),
            i64(k.shape[1]), i64(head_dim), i64(k.shape[2]), *_bounds(rows, runs, k),
            i64(torch.get_num_threads()), ptr(out.data_ptr()), ptr(lse.data_ptr()))
        if status == -2:
            raise MemoryError("attention kernel: no memory for its work buffers")
        if status != 0:
            raise ValueError(f"attention kernel refused shape q {tuple(q.shape)}, pages "
                             f"{tuple(k.shape)}")
        return out.view(rows, heads * head_dim), lse


    def backward(self, q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 d_out_R_H_D: torch.Tensor, lse_R_H: torch.Tensor, delta_R_H: torch.Tensor,
                 runs: AttentionRuns) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients of ``q`` ``[R, H, D]`` and of the pages (contiguous, their shape) from
        the output's gradient, the forward's log-sum-exp and ``delta`` = rowsum(dO ∘ O), both
        ``[R, H]``. Rows of no sequence (padding) and pages no row reads get zeros; the
        sequences' pages must be disjoint (`AttentionRuns.pages_disjoint`)."""
        q, d_out = q_R_H_D.detach().contiguous(), d_out_R_H_D.detach().contiguous()
        k, v = k_pages.detach().contiguous(), v_pages.detach().contiguous()
        lse, delta = lse_R_H.detach().contiguous(), delta_R_H.detach().contiguous()
        _, heads, head_dim = q.shape
        d_q, d_k, d_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        max_keys = int(runs.seq_keys_S.max()) if runs.seq_keys_S.numel() else 0
        status = self.library.la_backward(
            ptr(q.data_ptr()), ptr(k.data_ptr()), ptr(v.data_ptr()), ptr(d_out.data_ptr()),
            ptr(lse.data_ptr()), ptr(delta.data_ptr()), ptr(runs.tables_B_N.data_ptr()),
            ptr(runs.seq_row_S.data_ptr()), ptr(runs.seq_len_S.data_ptr()),
            ptr(runs.seq_table_S.data_ptr()), ptr(runs.row_keys_R.data_ptr()),
            i64(runs.seq_row_S.numel()), i64(max_keys), i64(heads), i64(k.shape[1]),
            i64(head_dim), i64(k.shape[2]), *_bounds(q.shape[0], runs, k),
            i64(torch.get_num_threads()), ptr(d_q.data_ptr()), ptr(d_k.data_ptr()),
            ptr(d_v.data_ptr()))
        if status == -2:
            raise MemoryError("attention backward: no memory for its work buffers")
        if status != 0:
            raise ValueError(f"attention backward refused shape q {tuple(q.shape)}, pages "
                             f"{tuple(k.shape)}, or rows that are not consecutive positions")
        return d_q, d_k, d_v

    @staticmethod
    def backward_fits(runs: AttentionRuns, kv_heads: int, block_size: int) -> bool:
        """Whether the backward takes this batch: its sequences' pages are disjoint, and its
        (sequence, kv head) items, which it never splits, are at least one per thread (fewer,
        and the tiled torch backward spreads the work better)."""
        items = runs.seq_row_S.numel() * kv_heads
        return items >= torch.get_num_threads() and runs.pages_disjoint(block_size)


def attention_kernel(device: torch.device, dtype: torch.dtype) -> AttentionKernel | None:
    """The kernel for a CPU float32 model, or None (the reason logged when it cannot be built)."""
    if device.type != "cpu" or dtype != torch.float32:
        return None
    found = native_library.vectorized("paged_attention", "la_lanes",
                                      "attention uses the tiled torch kernel")
    return None if found is None else AttentionKernel(*found)
