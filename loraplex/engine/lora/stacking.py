"""`stack_adapters`: the adapters of a batch's segments, stacked per target into a `LoraBatch`.

Adapters are zero-padded to the batch's rank ``Rk`` (exact zero contributions); in
batch-invariant mode ``Rk`` is rounded up to a multiple of 16, because MKL's sgemm results for a
rank-r column change when the total output width is below 16 but not above it. An adapter that
does not train a target present in the batch contributes exact zeros there. Stacking is
differentiable: gradients reach each adapter's own leaves through ``torch.stack``.

An expert target's per-adapter ``[L, 1 or E, r, d]`` tensors stack to ``[L, 1·S or E·S, Rk, d]``
(`StackedTarget`): expert-major, so a shared factor is indexed by segment and a per-expert one
by ``expert · S + segment``, the order of the MoE layer's (expert × adapter) segments.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.targets import ALL_TARGETS, target_shape
from loraplex.engine.model.lora_batch import LoraBatch, LoraRows, StackedTarget, fuse_a
from loraplex.engine.model.spec import ModelSpec


def stack_adapters(spec: ModelSpec, adapters: Sequence[LoraAdapter], rows: LoraRows, *,
                   rank_multiple: int, dtype: torch.dtype,
                   reuse: LoraBatch | None = None,
                   device: torch.device | None = None) -> LoraBatch:
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
        device: where the stacks live (default: the first adapter tensor's device).
    """
    # A pipeline stage may hold no tensor of an adapter (one that trains the head only).
    device = device or next((p.device for a in adapters for p in a.parameters()),
                            torch.device("cpu"))
    if reuse is not None and reuse.rows.adapter_ids == rows.adapter_ids:
        targets, fused = dict(reuse.targets), dict(reuse.fused_a)
    else:
        targets = _stack_targets(spec, adapters, rank_multiple, dtype, device)
        fused = fuse_a(targets)
    ends = torch.tensor(rows.segment_ends, dtype=torch.int64)
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    scales = torch.tensor([a.scale for a in adapters], dtype=dtype)
    return LoraBatch(
        rows=rows,
        offsets_S=ends.to(torch.int32).to(device),
        scale_P_1=torch.repeat_interleave(scales, sizes)[:, None].to(device),
        scale_S=scales.to(device),
        targets=targets,
        fused_a=fused,
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
                a_parts.append(torch.zeros(shape.a_shape(rank), device=device))
                b_parts.append(torch.zeros(shape.b_shape(rank), device=device))
                continue
            pad = rank - adapter.rank  # F.pad copies even when pad is 0: skip it then
            a_parts.append(F.pad(w.a_L_Rk_I, (0, 0, 0, pad)) if pad else w.a_L_Rk_I)
            b_parts.append(F.pad(w.b_L_O_Rk, (0, pad)) if pad else w.b_L_O_Rk)
        targets[target] = StackedTarget(_stack(a_parts, shape.is_expert).to(dtype),
                                        _stack(b_parts, shape.is_expert).to(dtype))
    return targets


def _stack(parts: list[torch.Tensor], is_expert: bool) -> torch.Tensor:
    """Per-adapter ``[L, ...]`` → ``[L, S, ...]``; expert ``[L, E, ...]`` → ``[L, E·S, ...]``."""
    if not is_expert:
        return torch.stack(parts, dim=1)
    return torch.stack(parts, dim=2).flatten(1, 2)
