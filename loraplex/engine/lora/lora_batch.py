"""`LoraBatch`: the adapters present in one forward, stacked per target for segment GEMMs.

Rows of a `PackedBatch` are sorted by adapter into segments, so the delta of every segment is
two grouped GEMMs (``F.grouped_mm``: shrink to rank, expand to d_out), with no Python loop over
tenants. Adapters are zero-padded to the batch's rank ``R`` (exact zero contributions); in
batch-invariant mode ``R`` is rounded up to a multiple of 16, because MKL's sgemm results for a
rank-r column change when the total output width is below 16 but not above it. An adapter that
does not train a target present in the batch contributes exact zeros there. Stacking is
differentiable: gradients reach each adapter's own leaves through ``torch.stack``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.targets import ALL_TARGETS, target_shape
from loraplex.engine.model.spec import ModelSpec


@dataclass(frozen=True)
class StackedTarget:
    """One target for all segments: ``a [L, S, R, d_in]``, ``b [L, S, d_out, R]``."""

    a_L_S_R_I: torch.Tensor
    b_L_S_O_R: torch.Tensor


@dataclass(frozen=True)
class LoraBatch:
    """What the forward needs to add every segment's LoRA delta.

    Attributes:
        offsets_S: int32 cumulative segment end rows (``F.grouped_mm`` offsets).
        num_rows: rows covered by adapter segments (rows ``0 .. num_rows-1``).
        scale_N_1: per-row ``alpha / rank`` of the row's adapter.
        targets: stacked tensors of every target some adapter in the batch trains.
    """

    offsets_S: torch.Tensor
    num_rows: int
    scale_N_1: torch.Tensor
    targets: Mapping[str, StackedTarget]

    def delta(self, target: str, layer: int, x_N_I: torch.Tensor) -> torch.Tensor | None:
        """``scale · (x Aᵀ) Bᵀ`` per segment for rows ``0 .. num_rows-1``; None if untrained."""
        stacked = self.targets.get(target)
        if stacked is None:
            return None
        h_N_R = grouped_linear(x_N_I, stacked.a_L_S_R_I[layer], self.offsets_S) * self.scale_N_1
        return grouped_linear(h_N_R, stacked.b_L_S_O_R[layer], self.offsets_S)


def grouped_linear(x_N_I: torch.Tensor, w_S_O_I: torch.Tensor, offsets_S: torch.Tensor
                   ) -> torch.Tensor:
    """Segment ``s`` of the rows times ``w[s]ᵀ``.

    ``F.grouped_mm`` runs on CPU in fp32 (with autograd) and on CUDA in bf16, and needs row
    strides that are multiples of 16 bytes (`stack_adapters` pads ranks accordingly). Other
    cases (CUDA fp32, odd model dims) fall back to a loop over segments: a slow path that the
    real models on CPU never take.
    """
    aligned = all(d * x_N_I.element_size() % 16 == 0 for d in w_S_O_I.shape[1:])
    supported = x_N_I.device.type == "cpu" or x_N_I.dtype == torch.bfloat16
    if aligned and supported:
        return F.grouped_mm(x_N_I, w_S_O_I.transpose(1, 2), offs=offsets_S)
    ends = offsets_S.tolist()
    starts = [0, *ends[:-1]]
    return torch.cat([F.linear(x_N_I[s:e], w_S_O_I[i]) for i, (s, e) in
                      enumerate(zip(starts, ends, strict=True))])


def stack_adapters(spec: ModelSpec, adapters: Sequence[LoraAdapter],
                   segment_row_ends: Sequence[int], *, rank_multiple: int,
                   dtype: torch.dtype) -> LoraBatch:
    """Stack the segments' adapters (segment order) into a `LoraBatch`.

    Args:
        adapters: one adapter per segment, in row order.
        segment_row_ends: cumulative end row of each segment.
        rank_multiple: pad the stacked rank up to a multiple of this (16 for batch invariance;
            at least 16 bytes' worth in any case, as ``F.grouped_mm`` requires).
        dtype: compute dtype of the stacked tensors (adapter leaves stay fp32).
    """
    device = adapters[0].parameters()[0].device
    rank = max(a.rank for a in adapters)
    rank += -rank % max(rank_multiple, 128 // torch.finfo(dtype).bits)  # 16-byte rows
    targets = {}
    for target in ALL_TARGETS:
        if not any(target in a.weights for a in adapters):
            continue
        shape = target_shape(spec, target)
        a_parts, b_parts = [], []
        for adapter in adapters:
            w = adapter.weights.get(target)
            if w is None:
                a_parts.append(torch.zeros(shape.num_layers, rank, shape.d_in, device=device))
                b_parts.append(torch.zeros(shape.num_layers, shape.d_out, rank, device=device))
                continue
            pad = rank - adapter.rank
            a_parts.append(F.pad(w.a_L_R_I, (0, 0, 0, pad)))
            b_parts.append(F.pad(w.b_L_O_R, (0, pad)))
        targets[target] = StackedTarget(torch.stack(a_parts, dim=1).to(dtype),
                                        torch.stack(b_parts, dim=1).to(dtype))
    ends = torch.tensor(list(segment_row_ends), dtype=torch.int64)
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    scales = torch.tensor([a.scale for a in adapters], dtype=dtype)
    return LoraBatch(
        offsets_S=ends.to(torch.int32).to(device),
        num_rows=int(ends[-1]),
        scale_N_1=torch.repeat_interleave(scales, sizes)[:, None].to(device),
        targets=targets,
    )
