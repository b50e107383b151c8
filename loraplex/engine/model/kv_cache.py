"""`PagedKVCache`: the tensors of a paged key/value cache; block allocation lives elsewhere.

Layout per layer: ``k[layer]`` and ``v[layer]`` are ``[num_blocks, num_kv_heads, block_size,
head_dim]`` (head-major inside a block, so one gathered block is directly a ``[heads, keys,
head_dim]`` matmul operand). A sequence owns a block table (block ids, in position order);
position ``p`` lives in block ``table[p // block_size]`` at offset ``p % block_size``.
The forward writes new keys/values before attending, so prefill, decode and training read
identical layouts. Blocks must hold finite values: the cache starts zeroed and only finite
activations are written, because masked keys are multiplied by exactly-zero probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.model.spec import ModelSpec


@dataclass
class PagedKVCache:
    """Key/value pages for every layer of one model.

    Attributes:
        k, v: per-layer ``[num_blocks, num_kv_heads, block_size, head_dim]`` tensors.
        block_size: positions per block (the attention's KV block size).
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    block_size: int

    @staticmethod
    def allocate(spec: ModelSpec, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> PagedKVCache:
        """Zero-filled pages for ``num_blocks`` blocks of ``block_size`` positions."""
        shape = (num_blocks, spec.num_kv_heads, block_size, spec.head_dim)
        k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_layers)]
        v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_layers)]
        return PagedKVCache(k, v, block_size)

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def write(self, layer: int, block_T: torch.Tensor, offset_T: torch.Tensor,
              k_T_H_D: torch.Tensor, v_T_H_D: torch.Tensor) -> None:
        """Store T new positions' keys/values in place (no autograd: sampler use)."""
        self.k[layer].permute(0, 2, 1, 3).index_put_((block_T, offset_T), k_T_H_D.detach())
        self.v[layer].permute(0, 2, 1, 3).index_put_((block_T, offset_T), v_T_H_D.detach())

    def zero_blocks(self, blocks: torch.Tensor) -> None:
        """Clear pages (e.g. when a block manager hands out a recycled block)."""
        for t in (*self.k, *self.v):
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
