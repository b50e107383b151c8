"""`LoraBatch` over several layers and segments against a per-segment ``F.linear`` reference:
the forward bitwise, the gradients into the stacked factors equal (the per-layer `unbind` views
must not change a bit of either), and the backward free of the per-layer whole-tensor
zero-fills that indexing ``a[l]`` costs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from loraplex.engine.model.lora_batch import LoraBatch, LoraRows, StackedTarget, fuse_a
from tests.engine.threads import one_thread  # noqa: F401

SEGMENTS = (32, 16, 48)  # rows per segment, multiples of the row multiple
LAYERS, RANK, D_IN = 3, 16, 64
OUTS = {"q_proj": 64, "k_proj": 32, "v_proj": 32, "o_proj": 64}


def _batch() -> tuple[LoraBatch, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    s = len(SEGMENTS)
    targets, leaves = {}, []
    for name, d_out in OUTS.items():
        a = torch.randn(LAYERS, s, RANK, D_IN, generator=gen).requires_grad_()
        b = torch.randn(LAYERS, s, d_out, RANK, generator=gen).requires_grad_()
        targets[name] = StackedTarget(a, b)
        leaves += [a, b]
    ends = torch.tensor(SEGMENTS).cumsum(0)
    rows = LoraRows(("x", "y", "z"), int(ends[-1]), tuple(ends.tolist()))
    scale_S = torch.tensor([2.0, 0.5, 1.0])
    scale_P_1 = torch.repeat_interleave(scale_S, torch.tensor(SEGMENTS))
    return LoraBatch(rows, ends.to(torch.int32), scale_P_1[:, None], scale_S, targets,
                     fuse_a(targets)), leaves


def _forward(lora: LoraBatch, x_L_R_I: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for layer in range(LAYERS):
        ys = [torch.zeros(x_L_R_I.shape[1], OUTS[t]) for t in ("q_proj", "k_proj", "v_proj")]
        outs += lora.add_deltas(ys, x_L_R_I[layer], ("q_proj", "k_proj", "v_proj"), layer)
        outs.append(lora.add_delta(torch.zeros(x_L_R_I.shape[1], 64), x_L_R_I[layer], "o_proj",
                                   layer))
    return outs


def _reference(lora: LoraBatch, x_L_R_I: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, per segment: ``scale · F.linear(F.linear(x, a[l, s]), b[l, s])``."""
    starts = (0, *lora.rows.segment_ends[:-1])
    bounds = list(zip(starts, lora.rows.segment_ends, strict=True))
    outs = []
    for layer in range(LAYERS):
        for t in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w = lora.targets[t]
            outs.append(torch.cat([
                F.linear(F.linear(x_L_R_I[layer, lo:hi], w.a_L_S_Rk_I[layer, s])
                         * lora.scale_P_1[lo:hi], w.b_L_S_O_Rk[layer, s])
                for s, (lo, hi) in enumerate(bounds)]))
    return outs


def test_layers_and_segments_match_the_per_segment_reference() -> None:
    lora, leaves = _batch()
    x_L_R_I = torch.randn(LAYERS, sum(SEGMENTS), D_IN, generator=torch.Generator().manual_seed(1))
    outs, refs = _forward(lora, x_L_R_I), _reference(lora, x_L_R_I)
    for out, ref in zip(outs, refs, strict=True):
        assert torch.equal(out, ref)  # grouped_mm runs each segment as that very GEMM
    gen = torch.Generator().manual_seed(2)
    gs = [torch.randn(o.shape, generator=gen) for o in outs]
    got = torch.autograd.grad(outs, leaves, gs)
    want = torch.autograd.grad(refs, leaves, gs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        assert g.abs().sum() > 0  # every layer and segment of every factor is trained


def test_backward_zero_fills_no_whole_stacked_gradient_per_layer() -> None:
    lora, leaves = _batch()
    x_L_R_I = torch.randn(LAYERS, sum(SEGMENTS), D_IN)
    outs = _forward(lora, x_L_R_I)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.autograd.grad([o.sum() for o in outs], leaves)
    whole = {tuple(t.shape) for t in leaves} | {tuple(a.shape) for a in lora.fused_a.values()}
    fills = [e for e in prof.events()
             if e.name in ("aten::fill_", "aten::zero_") and e.input_shapes
             and tuple(e.input_shapes[0]) in whole]
    # Indexing a[l] would zero-fill one whole [L, S, …] gradient per layer and target.
    assert len(fills) == 0, [(e.name, e.input_shapes[0]) for e in fills]
