"""`kernel_weights`, `exact_in`, `store_in`: which base weights a CPU engine may hold in bfloat16,
and holding them so.

The packed GEMM kernel reads float32 or bfloat16 weights and computes in float32 either way: it
widens each bfloat16 weight as it loads it, which is exact (`engine.kernels.packed_linear`).
So holding a weight in bfloat16 changes no bit where the weight is a bfloat16 value already
(a model published in bf16, loaded into float32 compute, is exactly that) and otherwise rounds
it once, at load; every result is then the float32 engine's on the rounded weights, with half
the bytes per weight (what a memory-bound decode step streams). `loader` decides from
``engine.dtype`` (`EngineConfig`).

The weights held so are the ones the kernel runs: each attention layer's q/k/v/o, each dense
MLP's gate/up/down, a linear-attention layer's input and output projections, a shared expert's
projections, the output head, and the embedding table (the tied head's matrix; its looked-up
rows are widened). Routed experts (grouped GEMMs), norms, biases, routers, convolutions and the
vision tower stay as loaded.
"""

from __future__ import annotations

from typing import Any

import torch

from loraplex.engine.model.weights import ATTENTION_FIELDS, MLP_FIELDS, BaseWeights

#: A linear-attention layer's projections that the kernel runs (`DeltaNetWeights` fields).
LINEAR_ATTENTION_FIELDS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
SHARED_EXPERT_FIELDS = ("gate_proj", "up_proj", "down_proj")


def kernel_weights(weights: BaseWeights) -> list[tuple[Any, str]]:
    """``(holder, field)`` of every weight the packed kernel runs (see the module docstring),
    the vocabulary's first."""
    slots: list[tuple[Any, str]] = [(weights, f) for f in ("embed", "lm_head")
                                    if getattr(weights, f) is not None]
    for layer in weights.layers:
        slots += [(layer, f) for f in (*ATTENTION_FIELDS, *MLP_FIELDS)
                  if getattr(layer, f) is not None]
        if layer.linear is not None:
            slots += [(layer.linear, f) for f in LINEAR_ATTENTION_FIELDS]
        if layer.experts is not None and layer.experts.shared is not None:
            slots += [(layer.experts.shared, f) for f in SHARED_EXPERT_FIELDS]
    return slots


def exact_in(weights: BaseWeights, dtype: torch.dtype) -> bool:
    """Whether every kernel weight is a value of ``dtype`` (holding it there loses nothing)."""
    for holder, name in kernel_weights(weights):
        tensor: torch.Tensor = getattr(holder, name)
        if not torch.equal(tensor.to(dtype).to(tensor.dtype), tensor):
            return False
    return True


def store_in(weights: BaseWeights, dtype: torch.dtype) -> None:
    """Hold every kernel weight in ``dtype`` (rounding to nearest even where it is not a value
    of it), in place; a tied head stays the embedding's very tensor."""
    tied = weights.lm_head is not None and weights.lm_head is weights.embed
    for holder, name in kernel_weights(weights):
        if tied and holder is weights and name == "lm_head":
            weights.lm_head = weights.embed
            continue
        tensor: torch.Tensor = getattr(holder, name)
        setattr(holder, name, tensor.to(dtype).contiguous())
