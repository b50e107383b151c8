"""Rotary position embeddings: inverse frequencies (default, llama3 and yarn scaling) and a
cos/sin table looked up by absolute position.

The table grows in fixed chunks of positions, each computed by the same fixed-shape ops, so a
position's cos/sin values never depend on which batch first needed them (batch invariance).
With a partial rotary factor the table covers the rotating dimensions only, and `apply_rope`
rotates those and passes the rest through (transformers' Qwen3-Next / Qwen3.5).
"""

from __future__ import annotations

import math

import torch

from loraplex.engine.model.rope_spec import RopeSpec

CHUNK_POSITIONS = 4096


def inverse_frequencies(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """fp32 ``[rotary_dim // 2]`` inverse frequencies, as transformers computes them."""
    dim = rope.rotary_dim(head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.kind == "default":
        return inv_freq
    if rope.kind == "yarn":
        return _yarn_frequencies(rope, dim)
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


def _yarn_frequencies(rope: RopeSpec, dim: int) -> torch.Tensor:
    """transformers' ``_compute_yarn_parameters`` inverse frequencies: interpolated (÷ factor)
    below the correction range, extrapolated above it, a linear ramp between."""
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


class RopeTable:
    """cos/sin of every position seen so far, ``[positions, rotary_dim]`` in the compute dtype
    (yarn's attention factor applied)."""

    def __init__(self, rope: RopeSpec, head_dim: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.inv_freq = inverse_frequencies(rope, head_dim).to(device)
        self.attention_factor = rope.attention_factor
        self.rotary_dim = rope.rotary_dim(head_dim)
        self.device = device
        self.dtype = dtype
        self.cos = torch.empty(0, self.rotary_dim, device=device, dtype=dtype)
        self.sin = torch.empty(0, self.rotary_dim, device=device, dtype=dtype)

    def _grow(self, num_positions: int) -> None:
        cos, sin = [self.cos], [self.sin]
        start = self.cos.shape[0]
        while start < num_positions:
            pos = torch.arange(start, start + CHUNK_POSITIONS, device=self.device,
                               dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            if self.attention_factor != 1.0:
                cos.append((emb.cos() * self.attention_factor).to(self.dtype))
                sin.append((emb.sin() * self.attention_factor).to(self.dtype))
            else:
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


    def lookup_mrope(self, positions_3_R: torch.Tensor, section: tuple[int, int, int]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """`lookup` for M-RoPE positions ``[3, N]`` (time, row, column): frequency f takes the
        row axis's angle where ``f % 3 == 1`` and ``f < 3·section[1]``, the column axis's where
        ``f % 3 == 2`` and ``f < 3·section[2]``, else the time axis's (transformers'
        interleaved layout). Each angle is the table's entry for that position, so a token at
        (p, p, p) gets `lookup`'s bits."""
        cos_sin = [self.lookup(positions_3_R[a]) for a in range(3)]
        axes = mrope_axes(section, self.rotary_dim, positions_3_R.device)
        index = axes.view(1, 1, 1, -1).expand(1, positions_3_R.shape[1], 1, -1)
        cos = torch.stack([c for c, _ in cos_sin]).gather(0, index).squeeze(0)
        sin = torch.stack([s for _, s in cos_sin]).gather(0, index).squeeze(0)
        return cos, sin


def mrope_axes(section: tuple[int, int, int], rotary_dim: int,
               device: torch.device) -> torch.Tensor:
    """The axis (0 time, 1 row, 2 column) of each of the table's ``rotary_dim`` columns."""
    f = torch.arange(rotary_dim // 2, device=device)
    axes = torch.zeros_like(f)
    axes[(f % 3 == 1) & (f < 3 * section[1])] = 1
    axes[(f % 3 == 2) & (f < 3 * section[2])] = 2
    return torch.cat([axes, axes])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [N, heads, head_dim]`` by per-row ``cos``, ``signed_sin [N, 1, rotary_dim]``
    (`RopeTable.lookup`). HF's ``x·cos + rotate_half(x)·sin``, rotate_half(x) = ``(-x₂, x₁)``,
    bit for bit: ``(-x₂)·s₁ = x₂·(-s₁)`` exactly, so the halves are swapped (one roll) and
    the sign rides on the table. gpt-oss's ``(x₁c − x₂s, x₂c + x₁s)`` is the same arithmetic.
    A table narrower than the head rotates the first ``rotary_dim`` dimensions only."""
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return x * cos + x.roll(rotary // 2, -1) * signed_sin
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    return torch.cat([x_rot * cos + x_rot.roll(rotary // 2, -1) * signed_sin, x_pass], dim=-1)
