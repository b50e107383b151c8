"""`LoraRows` and `LoraBatch`: where a packed batch's adapter segments are, and how the forward
adds their LoRA deltas.

`pack_sequences` sorts the rows of a `PackedBatch` by adapter into segments, each padded to the
row multiple (in place, or in a gathered LoRA layout: `LoraRows`), so the delta of every segment
is two grouped GEMMs (``F.grouped_mm``: shrink to rank, expand to d_out) per target, with no
Python loop over tenants. The stacked per-segment tensors arrive ready-made in a `LoraBatch`
(built by `engine.lora.stacking`): this module knows nothing about adapters, their storage or
how their ranks are padded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LoraRows:
    """Where adapter segments live, for the segment GEMMs (``F.grouped_mm`` offsets).

    Attributes:
        adapter_ids: adapters in segment order.
        num_rows: batch rows ``0 .. num_rows-1`` belong to adapter segments.
        segment_ends: cumulative segment ends in the LoRA layout (multiples of row_multiple).
        gather_P: None when the LoRA layout is batch rows ``0 .. num_rows-1`` themselves
            (segments padded in place); else the batch row of each LoRA row (pads → row 0).
        real_P: with ``gather_P``: the LoRA rows holding real tokens, in batch-row order.
    """

    adapter_ids: tuple[str, ...]
    num_rows: int
    segment_ends: tuple[int, ...]
    gather_P: torch.Tensor | None = None
    real_P: torch.Tensor | None = None

    def batch_ranges(self) -> list[tuple[int, int]]:
        """Each segment's batch rows ``[start, end)``: the segments tile rows
        ``0 .. num_rows-1`` in order (in place: with their padding; gathered: unpadded)."""
        if self.real_P is None:
            return list(zip((0, *self.segment_ends[:-1]), self.segment_ends, strict=True))
        ends = torch.tensor(self.segment_ends, dtype=self.real_P.dtype, device=self.real_P.device)
        counts = torch.searchsorted(self.real_P, ends).tolist()  # real rows before each end
        return list(zip([0, *counts[:-1]], counts, strict=True))

    def window(self, start: int, end: int, row_multiple: int) -> LoraRows | None:
        """The LoRA layout of batch rows ``[start, end)`` alone: their rows numbered from 0,
        every segment's share padded to ``row_multiple`` in a gathered layout (a segment with
        no row there keeps an empty share, so the stacked weights still line up); None when
        no adapter row is in the range. A row's LoRA GEMMs keep their bits (each segment's
        rows are still one GEMM of padded rows)."""
        gather: list[int] = []
        real: list[int] = []
        ends: list[int] = []
        for a, b in self.batch_ranges():
            lo, hi = max(a, start), min(b, end)
            if lo < hi:
                real += range(len(gather), len(gather) + hi - lo)
                gather += range(lo - start, hi - start)
                gather += [0] * (-(hi - lo) % row_multiple)
            ends.append(len(gather))
        if not real:
            return None
        device = self.gather_P.device if self.gather_P is not None else None

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return LoraRows(self.adapter_ids, len(real), tuple(ends), tensor(gather), tensor(real))


@dataclass(frozen=True)
class StackedTarget:
    """One target for all segments: ``a [L, S, Rk, d_in]``, ``b [L, S, d_out, Rk]``.

    The forward reads layer ``l`` as ``a_layers[l]`` (`unbind` views, the same bits as
    ``a[l]``): the backward then stacks the layers' gradients once, where indexing ``a[l]``
    would zero-fill and add a whole ``[L, …]`` gradient per layer (L² work: 30 layers × 8
    segments cost seconds per step on SmolLM2, measured).
    """

    a_L_S_Rk_I: torch.Tensor
    b_L_S_O_Rk: torch.Tensor

    @cached_property
    def a_layers(self) -> tuple[torch.Tensor, ...]:
        return self.a_L_S_Rk_I.unbind(0)

    @cached_property
    def b_layers(self) -> tuple[torch.Tensor, ...]:
        return self.b_L_S_O_Rk.unbind(0)


@dataclass(frozen=True)
class LoraBatch:
    """What the forward needs to add every segment's LoRA delta.

    Attributes:
        rows: where the segments are (`LoraRows` of the batch).
        offsets_S: int32 cumulative segment ends in the LoRA layout (``F.grouped_mm`` offsets).
        scale_P_1: per LoRA row ``alpha / rank`` of the row's adapter.
        scale_S: per segment ``alpha / rank`` (``scale_P_1``'s values, once each).
        targets: stacked tensors of every target some adapter in the batch trains.
        fused_a: targets that share an input (`FUSED_GROUPS`, all stacked) → their A
            factors concatenated along the rank, ``[L, S, n·Rk, d_in]``: one shrink GEMM for
            the group, with the bits of the separate ones (an output column depends only on
            its weight row).
    """

    rows: LoraRows
    offsets_S: torch.Tensor
    scale_P_1: torch.Tensor
    scale_S: torch.Tensor
    targets: Mapping[str, StackedTarget]
    fused_a: Mapping[tuple[str, ...], torch.Tensor] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows

    def window(self, start: int, end: int, row_multiple: int, targets: Sequence[str]
               ) -> LoraBatch | None:
        """The deltas of ``targets`` for batch rows ``[start, end)`` alone (`LoraRows.window`;
        the chunked head's windows). They read this batch's own stacks (no copy), so
        gradients reach the same per-layer views (`layer_views`)."""
        rows = self.rows.window(start, end, row_multiple)
        if rows is None:
            return None
        device = self.offsets_S.device
        ends = torch.tensor(rows.segment_ends, dtype=torch.int64)
        sizes = torch.diff(ends, prepend=ends.new_zeros(1)).to(device)
        return LoraBatch(rows, ends.to(torch.int32).to(device),
                         torch.repeat_interleave(self.scale_S, sizes)[:, None], self.scale_S,
                         {t: st for t, st in self.targets.items() if t in targets})

    @cached_property
    def _fused_layers(self) -> dict[tuple[str, ...], tuple[torch.Tensor, ...]]:
        """`fused_a` per layer (`unbind` views: one gradient stack, see `StackedTarget`)."""
        return {group: a_L_S_nRk_I.unbind(0) for group, a_L_S_nRk_I in self.fused_a.items()}

    def layer_views(self, index: Mapping[str, int]) -> tuple[torch.Tensor, ...]:
        """The per-layer views the forward reads for each target at its layer index (and the
        fused groups' A factors): what a recomputed layer must be differentiable in."""
        views = [v for t, st in self.targets.items() if t in index
                 for v in (st.a_layers[index[t]], st.b_layers[index[t]])]
        views += [layers[index[group[0]]] for group, layers in self._fused_layers.items()
                  if group[0] in index]
        return tuple(views)

    def delta(self, target: str, layer: int, x_P_I: torch.Tensor) -> torch.Tensor | None:
        """``scale · (x Aᵀ) Bᵀ`` per segment of LoRA-layout rows; None if no adapter trains it."""
        stacked = self.targets.get(target)
        if stacked is None:
            return None
        h_P_Rk = grouped_linear(x_P_I, stacked.a_layers[layer], self.offsets_S) * self.scale_P_1
        return grouped_linear(h_P_Rk, stacked.b_layers[layer], self.offsets_S)

    def add_delta(self, y_R_O: torch.Tensor, x_R_I: torch.Tensor, target: str, layer: int
                  ) -> torch.Tensor:
        """``y`` plus the delta on the adapter rows ``0 .. num_rows-1``."""
        return self.add_deltas([y_R_O], x_R_I, (target,), layer)[0]

    def add_deltas(self, ys_R_O: Sequence[torch.Tensor], x_R_I: torch.Tensor,
                   targets: Sequence[str], layer: int) -> list[torch.Tensor]:
        """`add_delta` for several targets sharing the input ``x`` (gathered once; one shrink
        GEMM when they are a fused group)."""
        x_P_I = self.to_lora_rows(x_R_I) if any(t in self.targets for t in targets) else x_R_I
        fused = self._fused_layers.get(tuple(targets))
        if fused is None:
            return [self._add(y_R_O, self.delta(target, layer, x_P_I))
                    for y_R_O, target in zip(ys_R_O, targets, strict=True)]
        h_P_nRk = grouped_linear(x_P_I, fused[layer], self.offsets_S) * self.scale_P_1
        hs = h_P_nRk.chunk(len(targets), dim=1)
        return [self._add(y_R_O, grouped_linear(h_P_Rk, self.targets[t].b_layers[layer],
                                                self.offsets_S))
                for y_R_O, h_P_Rk, t in zip(ys_R_O, hs, targets, strict=True)]

    def _add(self, y_R_O: torch.Tensor, delta_P_O: torch.Tensor | None) -> torch.Tensor:
        if delta_P_O is None:
            return y_R_O
        # Whole-tensor adds: an in-place add on the slice y[:n] costs a full-size
        # zero-fill + copy in autograd's backward (CopySlices / as_strided).
        return y_R_O + self.from_lora_rows(delta_P_O, y_R_O.shape[0])

    def to_lora_rows(self, x_R_I: torch.Tensor) -> torch.Tensor:
        """Batch rows → the LoRA layout (segments padded to the row multiple)."""
        n, gather = self.rows.num_rows, self.rows.gather_P
        if gather is not None:
            return x_R_I.index_select(0, gather)
        return x_R_I if n == x_R_I.shape[0] else x_R_I[:n]  # a no-op slice costs a SliceBackward

    def from_lora_rows(self, d_P_O: torch.Tensor, num_rows: int) -> torch.Tensor:
        """The LoRA layout → ``num_rows`` batch rows (zeros on the rows of no adapter)."""
        real = self.rows.real_P
        d_N_O = d_P_O if real is None else d_P_O.index_select(0, real)
        n = self.rows.num_rows
        return F.pad(d_N_O, (0, 0, 0, num_rows - n)) if n < num_rows else d_N_O


#: Targets that read the same input in a dense layer (`LoraBatch.fused_a`).
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"),
                ("in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z"))


def fuse_a(targets: Mapping[str, StackedTarget]) -> dict[tuple[str, ...], torch.Tensor]:
    """`LoraBatch.fused_a` of stacked targets (differentiable: a ``torch.cat``)."""
    return {group: torch.cat([targets[t].a_L_S_Rk_I for t in group], dim=2)
            for group in FUSED_GROUPS if all(t in targets for t in group)}


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
