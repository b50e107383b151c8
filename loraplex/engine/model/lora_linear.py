"""`lora_linear` and `fused_lora_linear`: a frozen base linear over all rows, plus its bias and
the LoRA delta on the adapter rows: how the decoder's attention and dense MLP projections run.

Linears sharing an input (q/k/v) run as one base GEMM of their stacked weights, split after
(the bits of the separate ones: an output column depends on its weight row only). Knows nothing
about layers, attention or where the adapters come from (`LoraBatch` is data).
"""

from __future__ import annotations

import torch

from loraplex.engine.kernels.packed_linear import FrozenLinear
from loraplex.engine.model.lora_batch import LoraBatch


def fused_lora_linear(x_R_I: torch.Tensor, linear: FrozenLinear, sizes: tuple[int, ...],
                      lora: LoraBatch | None, targets: tuple[str, ...], layer: int,
                      biases: tuple[torch.Tensor | None, ...] = ()) -> list[torch.Tensor]:
    """Linears sharing an input as one base GEMM (their weights stacked by rows), split into
    each one's output (plus its bias, if any) plus its LoRA delta."""
    outs = list(linear(x_R_I).split(sizes, dim=1))
    if biases and biases[0] is not None:
        outs = [y + b for y, b in zip(outs, biases, strict=True)]
    if lora is None:
        return outs
    return lora.add_deltas(outs, x_R_I, targets, layer)


def lora_linear(x_R_I: torch.Tensor, linear: FrozenLinear, lora: LoraBatch | None, target: str,
                layer: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Base linear on all rows (plus its bias), plus the LoRA delta on the adapter rows."""
    y_R_O = linear(x_R_I)
    if bias is not None:
        y_R_O = y_R_O + bias
    return y_R_O if lora is None else lora.add_delta(y_R_O, x_R_I, target, layer)

