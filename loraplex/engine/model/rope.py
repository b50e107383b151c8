"""Rotary position embeddings: inverse frequencies (default and llama3 scaling) and a cos/sin
table looked up by absolute position.

The table grows in fixed chunks of positions, each computed by the same fixed-shape ops, so a
position's cos/sin values never depend on which batch first needed them (batch invariance).
"""

from __future__ import annotations

import math

import torch

from loraplex.engine.model.spec import RopeSpec

CHUNK_POSITIONS = 4096


def inverse_frequencies(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """fp32 ``[head_dim // 2]`` inverse frequencies, as transformers computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.kind == "default":
        return inv_freq
    # Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth ramp between.
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RopeTable:
    """cos/sin of every position seen so far, ``[positions, head_dim]`` in the compute dtype."""

    def __init__(self, rope: RopeSpec, head_dim: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.inv_freq = inverse_frequencies(rope, head_dim).to(device)
        self.device = device
        self.dtype = dtype
        self.cos = torch.empty(0, head_dim, device=device, dtype=dtype)
        self.sin = torch.empty(0, head_dim, device=device, dtype=dtype)

    def _grow(self, num_positions: int) -> None:
        cos, sin = [self.cos], [self.sin]
        start = self.cos.shape[0]
        while start < num_positions:
            pos = torch.arange(start, start + CHUNK_POSITIONS, device=self.device,
                               dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos.append(emb.cos().to(self.dtype))
            sin.append(emb.sin().to(self.dtype))
            start += CHUNK_POSITIONS
        self.cos, self.sin = torch.cat(cos), torch.cat(sin)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (`apply_rope`) ``[N, 1, head_dim]``, broadcast over heads, for
        a ``[N]`` long tensor of absolute positions."""
        if positions.numel():
            top = int(positions.max()) + 1
            if top > self.cos.shape[0]:
                self._grow(top)
        sin = self.sin[positions]
        half = sin.shape[-1] // 2
        signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return self.cos[positions][:, None, :], signed[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [N, heads, head_dim]`` by per-row ``cos``, ``signed_sin [N, 1, head_dim]``
    (`RopeTable.lookup`). HF's ``x·cos + rotate_half(x)·sin``, rotate_half(x) = ``(-x₂, x₁)``,
    bit for bit: ``(-x₂)·s₁ = x₂·(-s₁)`` exactly, so the halves are swapped (one roll) and
    the sign rides on the table."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin
