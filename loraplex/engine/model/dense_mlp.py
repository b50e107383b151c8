"""`DenseMlp`: a dense decoder layer's SwiGLU MLP, ``down(silu(gate(x)) * up(x))``, with LoRA on
gate, up and down (a mixture-of-experts layer's MLP is a `SparseMlp` instead, `moe`).

Gate and up run as one base GEMM where the packed kernel applies (their weights stacked by
rows), else as two. Knows nothing about attention, the residual stream or adapters' storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loraplex.engine.kernels.packed_linear import FrozenLinear, GemmKernel
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.lora_linear import lora_linear
from loraplex.engine.model.weights import LayerWeights


@dataclass(frozen=True)
class DenseMlp:
    """A dense layer's MLP linears. ``gate_up``: one GEMM of gate and up stacked by rows
    (``sizes`` rows each) when the packed kernel applies it, else the two."""

    gate_up: tuple[FrozenLinear, ...]
    sizes: tuple[int, int]
    down: FrozenLinear

    @staticmethod
    def of(layer: LayerWeights, kernel: GemmKernel | None) -> DenseMlp:
        """With the packed kernel, gate and up become one GEMM (the fields rebound to views of
        it, as q/k/v); with MKL they stay two (fused, the ``16 × 576 → 3072`` decode GEMM
        measured slower than two ``→ 1536`` ones)."""
        assert layer.gate_proj is not None and layer.up_proj is not None
        assert layer.down_proj is not None
        sizes = (layer.gate_proj.shape[0], layer.up_proj.shape[0])
        down = FrozenLinear(layer.down_proj, kernel)
        if not FrozenLinear.packs(layer.gate_proj, kernel):  # nor the two stacked, then
            return DenseMlp((FrozenLinear(layer.gate_proj, kernel),
                             FrozenLinear(layer.up_proj, kernel)), sizes, down)
        fused = FrozenLinear(torch.cat([layer.gate_proj, layer.up_proj]), kernel)
        layer.gate_proj, layer.up_proj = fused.weight.split(sizes)
        return DenseMlp((fused,), sizes, down)

    def __call__(self, h_R_D: torch.Tensor, lora: LoraBatch | None, i: int) -> torch.Tensor:
        """The MLP of the normed rows ``h_R_D``; ``i`` is its LoRA layer index (its index
        among the dense layers)."""
        outs = (list(self.gate_up[0](h_R_D).split(self.sizes, dim=1)) if len(self.gate_up) == 1
                else [linear(h_R_D) for linear in self.gate_up])
        gate, up = outs if lora is None else lora.add_deltas(outs, h_R_D,
                                                             ("gate_proj", "up_proj"), i)
        return lora_linear(F.silu(gate) * up, self.down, lora, "down_proj", i)
