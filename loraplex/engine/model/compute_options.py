"""`ComputeOptions`: how the forward computes (batch-invariant or fast, GEMM and attention kernels,
recomputation), resolved once by the loader from `EngineConfig`.

What decides a result's bits lives here (`ComputeOptions.label`), with the LoRA rank padding of
batch-invariant mode (`RANK_MULTIPLE`). Knows nothing about the model's layers or weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from loraplex.engine.kernels.attention_kernel import AttentionKernel
from loraplex.engine.kernels.packed_linear import GemmKernel

Recompute = Literal["auto", "none", "layer"]
#: LoRA rank padding in batch-invariant mode: a GEMM's output width, where the row padding is
#: its row count. MKL's sgemm gives a column other bits when the output is narrower than 16
#: (`engine.lora.stacking`), so an r8 adapter pads to 16 whatever the row multiple.
RANK_MULTIPLE = 16


@dataclass(frozen=True)
class ComputeOptions:
    """How the forward computes (a slice of `EngineConfig`, resolved).

    Attributes:
        batch_invariant: pad GEMM rows to ``row_multiple`` and LoRA ranks to `RANK_MULTIPLE`
            (bitwise results independent of the batch); False: compact rows. Attention is the
            tiled paged kernel, except in fast mode on CUDA (SDPA over a dense gather); on CPU
            the tiled kernel measured faster than SDPA for training and decode alike.
        row_multiple: GEMM row padding in batch-invariant mode (the loader checks it on the
            machine: `row_quantum`).
        kv_block_size: keys per attention block and cache page.
        gemm: the packed sgemm kernel for the base linears and the head, with the inner
            dimensions at which it gives F.linear's bits on this machine (`gemm_order`) and
            the dtype it reads their weights in (bfloat16: `weight_storage`); None: F.linear
            everywhere.
        attention: the C paged-attention kernel for every attention forward (CPU); None:
            the tiled torch kernel's forward.
        recompute: ``layer``: a training forward keeps each layer's input only and recomputes
            the layer in the backward; ``none``: it keeps every activation; ``auto``: it
            keeps the activations of as many layers as ``activation_memory`` holds.
        activation_memory: bytes of kept activations under ``auto``.
    """

    batch_invariant: bool = True
    row_multiple: int = 8
    kv_block_size: int = 64
    gemm: GemmKernel | None = None
    attention: AttentionKernel | None = None
    recompute: Recompute = "layer"
    activation_memory: int = 0

    @property
    def effective_row_multiple(self) -> int:
        return self.row_multiple if self.batch_invariant else 1

    def label(self, device: torch.device, dtype: torch.dtype) -> str:
        """What decides the bits (`ModelInfo.compute`)."""
        gemm = "torch"
        if self.gemm is not None:
            weights = self.gemm.weight_dtype
            gemm = f"packed-{self.gemm.lanes}" + ("/bf16" if weights == torch.bfloat16 else "")
        attention = f"native-{self.attention.lanes}" if self.attention is not None else "torch"
        mode = f"invariant/{self.row_multiple}" if self.batch_invariant else "fast"
        return (f"{device.type} {str(dtype).removeprefix('torch.')} {mode} gemm={gemm} "
                f"attention={attention} torch={torch.__version__}")
