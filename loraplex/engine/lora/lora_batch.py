"""`LoraBatch`: the adapters present in one forward, stacked per target for segment GEMMs.

Rows of a `PackedBatch` are sorted by adapter into segments (each padded, in place or via a
gather: `LoraRows`), so the delta of every segment is two grouped GEMMs (``F.grouped_mm``:
shrink to rank, expand to d_out), with no Python loop over tenants. Adapters are zero-padded
to the batch's rank ``R`` (exact zero contributions); in batch-invariant mode ``R`` is rounded
up to a multiple of 16, because MKL's sgemm results for a rank-r column change when the total
output width is below 16 but not above it. An adapter that does not train a target present in
the batch contributes exact zeros there. Stacking is differentiable: gradients reach each
adapter's own leaves through ``torch.stack``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.targets import ALL_TARGETS, target_shape
from loraplex.engine.model.packed_batch import LoraRows
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
        rows: where the segments are (`LoraRows` of the batch).
        offsets_S: int32 cumulative segment ends in the LoRA layout (``F.grouped_mm`` offsets).
        scale_P_1: per LoRA row ``alpha / rank`` of the row's adapter.
        targets: stacked tensors of every target some adapter in the batch trains.
    """

    rows: LoraRows
    offsets_S: torch.Tensor
    scale_P_1: torch.Tensor
    targets: Mapping[str, StackedTarget]

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows

    def delta(self, target: str, layer: int, x_P_I: torch.Tensor) -> torch.Tensor | None:
        """``scale · (x Aᵀ) Bᵀ`` per segment of LoRA-layout rows; None if no adapter trains it."""
        stacked = self.targets.get(target)
        if stacked is None:
            return None
        h_P_R = grouped_linear(x_P_I, stacked.a_L_S_R_I[layer], self.offsets_S) * self.scale_P_1
        return grouped_linear(h_P_R, stacked.b_L_S_O_R[layer], self.offsets_S)

    def add_delta(self, y_R_O: torch.Tensor, x_R_I: torch.Tensor, target: str, layer: int
                  ) -> torch.Tensor:
        """``y`` plus the delta on the adapter rows ``0 .. num_rows-1``."""
        n, gather, real = self.rows.num_rows, self.rows.gather_P, self.rows.real_P
        if gather is not None:
            x_P_I = x_R_I.index_select(0, gather)
        else:  # a no-op slice would still cost a full-size SliceBackward
            x_P_I = x_R_I if n == x_R_I.shape[0] else x_R_I[:n]
        delta_P_O = self.delta(target, layer, x_P_I)
        if delta_P_O is None:
            return y_R_O
        delta_N_O = delta_P_O if real is None else delta_P_O.index_select(0, real)
        # Whole-tensor adds: an in-place add on the slice y[:n] costs a full-size
        # zero-fill + copy in autograd's backward (CopySlices / as_strided).
        if n < y_R_O.shape[0]:
            delta_N_O = F.pad(delta_N_O, (0, 0, 0, y_R_O.shape[0] - n))
        return y_R_O + delta_N_O


def grouped_linear(x_N_I: torch.Tensor, w_S_O_I: torch.Tensor, offsets_S: torch.Tensor
                   ) -> torch.Tensor:
    """Segment ``s`` of the rows times ``w[s]ᵀ``.

    ``F.grouped_mm`` runs on CPU in fp32 (with autograd) and on CUDA in bf16, and needs row
    strides that are multiples of 16 bytes (`stack_adapters` pads ranks accordingly). Other
    cases (CUDA fp32, odd model dims) fall back to a loop over segments: a slow path that the
    real models on CPU never take. One segment on CPU is a plain ``F.linear``: there
    ``grouped_mm`` runs each segment as that very GEMM (the same bits), with more overhead.
    """
    if w_S_O_I.shape[0] == 1 and x_N_I.device.type == "cpu":
        return F.linear(x_N_I, w_S_O_I[0])
    aligned = all(d * x_N_I.element_size() % 16 == 0 for d in w_S_O_I.shape[1:])
    supported = x_N_I.device.type == "cpu" or x_N_I.dtype == torch.bfloat16
    if aligned and supported:
        out = F.grouped_mm(x_N_I, w_S_O_I.transpose(1, 2), offs=offsets_S)
        if not out.requires_grad:
            return out
        result: torch.Tensor = _ContiguousGrad.apply(out)
        return result
    ends = offsets_S.tolist()
    starts = [0, *ends[:-1]]
    return torch.cat([F.linear(x_N_I[s:e], w_S_O_I[i]) for i, (s, e) in
                      enumerate(zip(starts, ends, strict=True))])


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: ``grouped_mm``'s
    backward rejects the stride-0 gradients that e.g. ``y.sum().backward()`` produces."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def stack_adapters(spec: ModelSpec, adapters: Sequence[LoraAdapter], rows: LoraRows, *,
                   rank_multiple: int, dtype: torch.dtype,
                   reuse: LoraBatch | None = None) -> LoraBatch:
    """Stack the segments' adapters (segment order) into a `LoraBatch`.

    Args:
        adapters: one adapter per segment, in segment order.
        rows: the batch's adapter segments.
        rank_multiple: pad the stacked rank up to a multiple of this (16 for batch invariance;
            at least 16 bytes' worth in any case, as ``F.grouped_mm`` requires).
        dtype: compute dtype of the stacked tensors (adapter leaves stay fp32).
        reuse: an earlier `LoraBatch` of the same adapters, in the same order, whose weights
            have not changed since (a sampler's decode steps): its stacked tensors are reused
            and only the row layout is rebuilt.
    """
    device = adapters[0].parameters()[0].device
    if reuse is not None and reuse.rows.adapter_ids == rows.adapter_ids:
        targets = dict(reuse.targets)
    else:
        targets = _stack_targets(spec, adapters, rank_multiple, dtype, device)
    ends = torch.tensor(rows.segment_ends, dtype=torch.int64)
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    scales = torch.tensor([a.scale for a in adapters], dtype=dtype)
    return LoraBatch(
        rows=rows,
        offsets_S=ends.to(torch.int32).to(device),
        scale_P_1=torch.repeat_interleave(scales, sizes)[:, None].to(device),
        targets=targets,
    )


def _stack_targets(spec: ModelSpec, adapters: Sequence[LoraAdapter], rank_multiple: int,
                   dtype: torch.dtype, device: torch.device) -> dict[str, StackedTarget]:
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
    return targets
