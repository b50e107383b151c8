"""`recomputed`: run one decoder layer (or one head window) without keeping its activations;
its backward runs it again (with autograd) from the saved input. `recomputed_layers`: how many
layers a training forward recomputes (``engine.recompute``: all, none, or under ``auto`` those
whose activations would not fit ``engine.activation_memory``, by `activation_bytes_per_row`);
`recomputes_head`: whether it recomputes the output head's windows too.

Why not ``torch.utils.checkpoint``: it gives the same arithmetic, but its forward still runs
in grad mode and allocates the layer's output last, among the layer's just-freed temporaries,
so on the retained host heap (`engine.host_allocator`) each layer left holes that the next
layer's larger blocks could not reuse: SmolLM2, 2,048 tokens, +35 MB of free heap per layer,
a step peaking 1.1 GB above its live bytes. Here the forward runs under ``no_grad`` and writes
the layer's output into a tensor the caller allocated before any layer ran (`output_slots`),
so what a layer leaves behind is never inside another layer's free space.

The backward recomputes the layer with the same deterministic ops (so the same bits: a CPU
model's kernels compute the same forward with and without autograd, checked by the tests)
and returns the gradients of the layer's input and of the LoRA tensors the layer reads
(per-layer views of the stacked adapters, passed in so autograd connects them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

# `torch.autograd.grad` with explicit grad_outputs (the backward below) imports this module
# (and sympy) on its first call: 0.5 s inside the first training step a server runs, long
# enough for a burst of requests to reach the tenant's in-flight limit behind it. Imported
# with the engine instead.
import torch.fx.experimental.symbolic_shapes

if TYPE_CHECKING:
    from loraplex.engine.model.compute_options import ComputeOptions
    from loraplex.engine.model.spec import ModelSpec

LayerFn = Callable[[torch.Tensor], torch.Tensor]


def activation_bytes_per_row(spec: ModelSpec, itemsize: int) -> int:
    """What autograd keeps per row and decoder layer without recomputation, estimated from
    the model's widths: 8 hidden-wide tensors (norms, residuals, projections' inputs), 4
    MLP-wide ones (gate, up, their activation and product; a sparse layer's routed rows
    counted ``top_k`` times plus its shared expert) and 2 per attention projection output.
    SmolLM2: 50,688 B, against 50,135 B measured (`benchmarks/memory.py`)."""
    mlp = spec.intermediate_size
    if spec.experts is not None:
        experts = spec.experts
        mlp = max(mlp, experts.top_k * experts.expert_intermediate_size
                  + experts.shared_intermediate_size)
    attention = spec.q_size + 2 * spec.kv_size
    return itemsize * (8 * spec.hidden_size + 4 * mlp + 2 * attention)


def recomputes_head(options: ComputeOptions, num_layers: int, row_bytes: int,
                    num_rows: int, vocab_size: int) -> bool:
    """Whether a training forward recomputes its output head's windows (`head_chunks`):
    unless nothing is recomputed (``none``), or under ``auto`` the head's kept logits and
    log-softmax (2 × rows × vocab × 4 B) fit ``activation_memory`` beside the layers kept."""
    match options.recompute:
        case "layer":
            return True
        case "none":
            return False
        case "auto":
            kept = num_layers - recomputed_layers(options, num_layers, row_bytes, num_rows)
            head = 2 * num_rows * vocab_size * 4
            return kept * row_bytes * num_rows + head > options.activation_memory


def recomputed_layers(options: ComputeOptions, num_layers: int, row_bytes: int,
                      num_rows: int) -> int:
    """How many decoder layers of a training forward of ``num_rows`` rows to recompute (the
    first ones): all (``layer``), none (``none``), or under ``auto`` those whose activations
    (``row_bytes`` per row and layer) would not fit ``options.activation_memory``."""
    match options.recompute:
        case "layer":
            return num_layers
        case "none":
            return 0
        case "auto":
            kept = options.activation_memory // max(1, row_bytes * num_rows)
            return max(0, num_layers - kept)


def output_slots(x_R_D: torch.Tensor, num_layers: int) -> list[torch.Tensor]:
    """One output tensor per layer, allocated together before the first layer runs."""
    return [torch.empty_like(x_R_D) for _ in range(num_layers)]


def recomputed(layer: LayerFn, x_R_D: torch.Tensor, lora_tensors: Sequence[torch.Tensor],
               slot: torch.Tensor | None = None) -> torch.Tensor:
    """``layer(x)`` (written into ``slot`` when given), differentiable in ``x`` and
    ``lora_tensors``: every tensor that needs a gradient and that ``layer`` reads besides
    ``x``, created before this call (views made inside the no-grad forward would not
    carry gradients)."""
    out: torch.Tensor = _Recomputed.apply(layer, x_R_D, slot, *lora_tensors)
    return out


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, layer: LayerFn, x_R_D: torch.Tensor, slot: torch.Tensor | None,
                *lora_tensors: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = layer(x_R_D)
            if slot is not None:
                out = slot.copy_(out)
                ctx.mark_dirty(slot)
        ctx.save_for_backward(x_R_D)
        # Kept as they are (not saved): the backward must name the very tensors that the
        # recomputed layer reads, views in the caller's graph.
        ctx.layer, ctx.lora_tensors = layer, lora_tensors
        return out

    @staticmethod
    def backward(ctx: Any, d_out_R_D: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x_R_D,), lora_tensors = ctx.saved_tensors, ctx.lora_tensors
        with torch.enable_grad():
            x_in = x_R_D.detach().requires_grad_(x_R_D.requires_grad)
            y_R_D = ctx.layer(x_in)
            wanted = [t for t in (x_in, *lora_tensors) if t.requires_grad]
            grads = iter(torch.autograd.grad(y_R_D, wanted, d_out_R_D, allow_unused=True))
        d_x = next(grads) if x_in.requires_grad else None
        d_lora = [next(grads) if t.requires_grad else None for t in lora_tensors]
        return (None, d_x, None, *d_lora)
