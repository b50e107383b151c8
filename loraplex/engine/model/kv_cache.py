"""`PagedKVCache`: the tensors of a paged key/value cache; block allocation lives elsewhere.

Layout per layer: ``k[layer]`` and ``v[layer]`` are ``[num_blocks, num_kv_heads, block_size,
head_dim]`` (head-major inside a block, so one gathered block is directly a ``[heads, keys,
head_dim]`` matmul operand). A sequence owns a block table (block ids, in position order);
position ``p`` lives in block ``table[p // block_size]`` at offset ``p % block_size``.
The forward writes new keys/values before attending, so prefill, decode and training read
identical layouts. Blocks must hold finite values: the cache starts zeroed and only finite
activations are written, because masked keys are multiplied by exactly-zero probabilities.
A hybrid model's linear-attention layers have no pages (empty tensors at their index); their
per-sequence state lives in ``linear`` (`LinearStates`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraplex.engine.model.linear_states import LinearStates
from loraplex.engine.model.spec import ModelSpec


@dataclass
class PagedKVCache:
    """Key/value pages for every layer of one model.

    Attributes:
        k, v: per-layer ``[num_blocks, num_kv_heads, block_size, head_dim]`` tensors (empty
            for a linear-attention layer).
        block_size: positions per block (the attention's KV block size).
        linear: the linear-attention layers' per-sequence states (None: no such layer).
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    block_size: int
    linear: LinearStates | None = field(default=None)

    @staticmethod
    def allocate(spec: ModelSpec, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> PagedKVCache:
        """Zero-filled pages for ``num_blocks`` blocks of ``block_size`` positions."""
        shape = (num_blocks, spec.num_kv_heads, block_size, spec.head_dim)

        def pages(layer: int) -> torch.Tensor:
            if spec.is_linear(layer):
                return torch.empty(0, device=device, dtype=dtype)
            return torch.zeros(shape, device=device, dtype=dtype)

        k = [pages(i) for i in range(spec.num_layers)]
        v = [pages(i) for i in range(spec.num_layers)]
        return PagedKVCache(k, v, block_size, LinearStates() if spec.linear_layers else None)

    @property
    def num_blocks(self) -> int:
        return max((t.shape[0] for t in self.k if t.numel()), default=0)

    @property
    def paged(self) -> list[torch.Tensor]:
        """Every layer's key and value pages (the layers that have pages)."""
        return [t for t in (*self.k, *self.v) if t.numel()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.paged)

    def write(self, layer: int, block_T: torch.Tensor, offset_T: torch.Tensor,
              k_T_H_D: torch.Tensor, v_T_H_D: torch.Tensor) -> None:
        """Store T new positions' keys/values in place (no autograd: sampler use)."""
        self.k[layer].permute(0, 2, 1, 3).index_put_((block_T, offset_T), k_T_H_D.detach())
        self.v[layer].permute(0, 2, 1, 3).index_put_((block_T, offset_T), v_T_H_D.detach())

    def zero_blocks(self, blocks: torch.Tensor) -> None:
        """Clear pages (e.g. when a block manager hands out a recycled block)."""
        for t in self.paged:
            t.index_fill_(0, blocks, 0.0)


def scratch_pages(num_blocks: int, block_size: int, block_T: torch.Tensor,
                  offset_T: torch.Tensor, x_T_H_D: torch.Tensor) -> torch.Tensor:
    """Out-of-place (autograd-safe) pages holding ``x`` at the given slots, zeros elsewhere.

    Used by the training forward, which has no persistent cache but must run the very same
    paged attention as the sampler. Returns ``[num_blocks, heads, block_size, head_dim]``.
    """
    heads, head_dim = x_T_H_D.shape[1], x_T_H_D.shape[2]
    pages = x_T_H_D.new_zeros(num_blocks, heads, block_size, head_dim)
    return pages.permute(0, 2, 1, 3).index_put((block_T, offset_T), x_T_H_D).permute(0, 2, 1, 3)
