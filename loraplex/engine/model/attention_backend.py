"""`AttentionBackend`: how one layer's causal attention over the paged KV layout is computed,
chosen at load for each layer (`choose_backend`) from what the layer needs (`LayerAttention`:
a sliding window, attention sinks) and what the machine offers:

* `NativeAttention`: the C kernel (`engine.kernels.attention_kernel`: CPU, float32), plain
  causal attention only; batch-invariant by construction.
* `TiledAttention`: the tiled torch kernel (`attention.tiled_paged_attention`), batch-invariant,
  with windows and sinks (its forward with the C kernel's when one is given and the layer is
  plain: the two agree bit for bit within a model, which uses one or the other everywhere).
* `DenseAttention`: one SDPA call over dense gathers (fast mode on CUDA), windows but no sinks.

A model chooses once, so training, prefill and decode of a layer always run the same backend
(sampler = trainer). Queries arrive scaled and keys/values written to their pages; no backend
knows about LoRA or weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from loraplex.engine.kernels.attention_kernel import AttentionKernel
from loraplex.engine.model.attention import AttentionExtras, dense_attention, tiled_paged_attention
from loraplex.engine.model.packed_batch import PackedBatch


@dataclass(frozen=True)
class LayerAttention:
    """What one layer's attention adds to plain causal softmax attention.

    Attributes:
        window: keys visible to a query: its own and the ``window - 1`` before it (gpt-oss's
            sliding layers); None: every earlier key.
        sinks_H: one learned logit per query head in every softmax denominator (gpt-oss);
            None: none.
    """

    window: int | None = None
    sinks_H: torch.Tensor | None = None

    @property
    def is_plain(self) -> bool:
        return self.window is None and self.sinks_H is None


class AttentionBackend(Protocol):
    """One layer's attention (see the module docstring)."""

    @property
    def name(self) -> str: ...

    def __call__(self, q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 batch: PackedBatch, layer: LayerAttention) -> torch.Tensor:
        """``[rows, heads · head_dim]`` for ``q`` scaled by ``head_dim ** -0.5``."""
        ...


@dataclass(frozen=True)
class NativeAttention:
    kernel: AttentionKernel
    name: str = "native"

    def __call__(self, q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 batch: PackedBatch, layer: LayerAttention) -> torch.Tensor:
        return tiled_paged_attention(q_R_H_D, k_pages, v_pages, batch.tiles, self.kernel,
                                     batch.attention_runs)


@dataclass(frozen=True)
class TiledAttention:
    name: str = "tiled"

    def __call__(self, q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 batch: PackedBatch, layer: LayerAttention) -> torch.Tensor:
        extras = AttentionExtras.of(batch.positions_R, q_R_H_D.shape[1], batch.block_size,
                                    layer.window, layer.sinks_H)
        return tiled_paged_attention(q_R_H_D, k_pages, v_pages, batch.tiles, extras=extras)


@dataclass(frozen=True)
class DenseAttention:
    num_kv_heads: int
    name: str = "dense"

    def __call__(self, q_R_H_D: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 batch: PackedBatch, layer: LayerAttention) -> torch.Tensor:
        assert layer.sinks_H is None, "SDPA has no sinks: choose_backend never picks it then"
        return dense_attention(q_R_H_D, k_pages, v_pages, batch, self.num_kv_heads,
                               layer.window)


def choose_backend(layer: LayerAttention, *, native: AttentionKernel | None,
                   batch_invariant: bool, device: torch.device, num_kv_heads: int
                   ) -> AttentionBackend:
    """The backend of one layer: the C kernel for a plain layer where it was loaded; else the
    tiles in batch-invariant mode or on a CPU (where they measured faster than SDPA); else
    SDPA, unless the layer has sinks."""
    if native is not None and layer.is_plain:
        return NativeAttention(native)
    if batch_invariant or device.type == "cpu" or layer.sinks_H is not None:
        return TiledAttention()
    return DenseAttention(num_kv_heads)
