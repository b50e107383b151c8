"""The output head over row windows: logits, log-softmax and the logprobs of chosen tokens,
without ever holding ``[tokens × vocab]``.

A training step needs ``log p(target)`` of a few tokens per row, not the rows' logits: 8,192
rows of SmolLM2's 49,152-word vocabulary are 1.6 GB per fp32 copy, and the full path kept
three (logits, log-softmax, their gradient). `HeadWindows` cuts the batch rows into windows of
at most `rows_per_window` rows (a window's logits stay under `HEAD_WINDOW_BYTES`);
`target_logprobs` runs the head, the fp32 log-softmax and the gather window by window; in a
training step each window runs without autograd and its backward recomputes that window's
logits instead of storing them (`layer_recompute.recomputed`): one window's ``[rows, vocab]``
alive at a time. Unless ``engine.recompute`` keeps them (``none``, or ``auto`` where they fit
``engine.activation_memory``: `Transformer.recomputes_head`).

Bits: a row's logits are the bits of the full-batch head (each window's rows padded to the row
multiple, its LoRA deltas one GEMM per adapter segment: `LoraBatch.window`), and the
log-softmax is row-local, so every logprob equals the unchunked path's and the sampler's.
Windows are cut at adapter-segment starts plus whole multiples of `rows_per_window` inside a
segment (small segments share a window), so an adapter's unembed gradient is a sum over cuts
that depend on its own rows only, never on the tenants packed beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from loraplex.engine.model.layer_recompute import recomputed
from loraplex.engine.model.lora_batch import LoraBatch

if TYPE_CHECKING:
    from loraplex.engine.model.transformer import Transformer

#: Most bytes of one window's fp32 logits (its log-softmax and gradient are as big again).
HEAD_WINDOW_BYTES = 64 << 20
UNEMBED = ("unembed",)


def rows_per_window(vocab_size: int, row_multiple: int,
                    budget_bytes: int = HEAD_WINDOW_BYTES) -> int:
    """Rows whose fp32 logits fit ``budget_bytes``, rounded down to the row multiple (at
    least one multiple)."""
    rows = budget_bytes // (4 * vocab_size)
    return max(row_multiple, rows - rows % row_multiple)


@dataclass(frozen=True)
class HeadWindows:
    """A batch's rows as head windows ``[start, end)``, in row order."""

    bounds: tuple[tuple[int, int], ...]

    @staticmethod
    def of(num_rows: int, segment_ranges: Sequence[tuple[int, int]], max_rows: int
           ) -> HeadWindows:
        """Cut at every segment start (and where the base rows start), then every
        ``max_rows`` rows inside a segment; merge neighbouring pieces while a window holds at
        most ``max_rows`` rows."""
        lora_end = segment_ranges[-1][1] if segment_ranges else 0
        ranges = [*segment_ranges, (lora_end, num_rows)]
        pieces = [(s, min(s + max_rows, b)) for a, b in ranges for s in range(a, b, max_rows)]
        bounds: list[tuple[int, int]] = []
        for a, b in pieces:
            if bounds and b - bounds[-1][0] <= max_rows:
                bounds[-1] = (bounds[-1][0], b)
            else:
                bounds.append((a, b))
        return HeadWindows(tuple(bounds))


def target_logprobs(model: Transformer, hidden_R_D: torch.Tensor, lora: LoraBatch | None,
                    rows_N: torch.Tensor, targets_N: torch.Tensor,
                    max_rows: int | None = None) -> torch.Tensor:
    """fp32 ``log p(targets_N[i] | row rows_N[i])`` for every pair ``i`` (rows may repeat:
    top-K targets), computed window by window (see the module docstring).

    Args:
        hidden_R_D: the final-norm hidden states of the batch (`Transformer.forward`).
        lora: the batch's `LoraBatch` (its unembed deltas), or None.
        rows_N, targets_N: the pairs, any order.
        max_rows: rows per window (default: `rows_per_window` for the model's vocabulary).
    """
    multiple = model.options.effective_row_multiple
    max_rows = max_rows or rows_per_window(model.spec.vocab_size, multiple)
    ranges = lora.rows.batch_ranges() if lora is not None else []
    windows = HeadWindows.of(hidden_R_D.shape[0], ranges, max_rows)
    order_N = torch.argsort(rows_N, stable=True)
    rows_sorted = rows_N.index_select(0, order_N)
    starts = torch.tensor([a for a, _ in windows.bounds], device=rows_N.device)
    firsts = [*torch.searchsorted(rows_sorted, starts).tolist(), rows_N.numel()]
    targets_sorted = targets_N.index_select(0, order_N)
    train = torch.is_grad_enabled() and hidden_R_D.requires_grad
    # Everything small a window needs is made first: allocated between windows, it would
    # land in the holes their logits leave (see `layer_recompute`).
    jobs = []
    # One split, not a slice per window: the backward then writes one [rows, hidden]
    # gradient instead of a zero-filled one per window.
    hidden_windows = hidden_R_D.split([b - a for a, b in windows.bounds])
    views = lora.layer_views({UNEMBED[0]: 0}) if lora is not None else ()
    for w, (start, end) in enumerate(windows.bounds):
        lo, hi = firsts[w], firsts[w + 1]
        if lo == hi:
            continue
        window_lora = None if lora is None else lora.window(start, end, multiple, UNEMBED)
        fn = partial(_window_logprobs, model, lora=window_lora, rows_n=rows_sorted[lo:hi] - start,
                     targets_n=targets_sorted[lo:hi])
        jobs.append((fn, hidden_windows[w], views if window_lora is not None else ()))
    recompute = train and model.recomputes_head(hidden_R_D.shape[0])
    parts = [recomputed(fn, x, views) if recompute else fn(x) for fn, x, views in jobs]
    picked = torch.cat(parts) if parts else hidden_R_D.new_zeros(0, dtype=torch.float32)
    inverse_N = torch.empty_like(order_N)
    inverse_N[order_N] = torch.arange(order_N.numel(), device=order_N.device)
    return picked.index_select(0, inverse_N)


def _window_logprobs(model: Transformer, hidden_W_D: torch.Tensor, *, lora: LoraBatch | None,
                     rows_n: torch.Tensor, targets_n: torch.Tensor) -> torch.Tensor:
    """One window: logits of its rows (padded to the row multiple), row-local fp32
    log-softmax, the pairs' entries."""
    pad = -hidden_W_D.shape[0] % model.options.effective_row_multiple
    x_P_D = F.pad(hidden_W_D, (0, 0, 0, pad)) if pad else hidden_W_D
    logprobs_P_V = torch.log_softmax(model.logits(x_P_D, lora).float(), dim=-1)
    return logprobs_P_V[rows_n, targets_n]
