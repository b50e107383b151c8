"""`VisionTower`: an image's patches → language-model token embeddings (and DeepStack features),
as transformers 5.24's ``Qwen3VLVisionModel`` / ``Qwen3_5VisionModel`` compute them.

Per image: the patch embedding (a linear map of each flattened patch), plus the learned position
grid resampled bilinearly (align_corners) to the image's patch grid; blocks of full
bidirectional attention with a 2-D (row, column) rotary embedding over the image's own patches
(each frame its own segment) and a GELU-tanh MLP; then the merger of each 2×2 patch group into
one token. The DeepStack mergers read the blocks named by the config. Patches arrive in
merge-block order (the processor's), so a group's 4 patches are consecutive rows.

The tower is frozen (Tinker adapts the language model only) and runs outside autograd, one
image at a time: an image's features are the same bits whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loraplex.engine.model.vision_spec import VisionSpec
from loraplex.engine.model.vision_weights import MergerWeights, VisionBlockWeights, VisionWeights

LAYER_NORM_EPS = 1e-6


@dataclass(frozen=True)
class ImageFeatures:
    """One image's output: ``embeds_N_D`` (N = merged tokens, D = the text model's hidden size)
    and one ``[N, D]`` DeepStack feature per decoder layer it feeds (first layers first)."""

    embeds_N_D: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]


class VisionTower:
    """A frozen vision tower on one device (its weights' dtype)."""

    def __init__(self, spec: VisionSpec, weights: VisionWeights) -> None:
        self.spec = spec
        self.weights = weights
        half = spec.head_dim // 2
        device = weights.patch_D_F.device
        exponents = torch.arange(0, half, 2, dtype=torch.float32, device=device) / half
        self._inv_freq = 1.0 / (spec.rope_theta ** exponents)

    @torch.no_grad()
    def __call__(self, pixels_P_F: torch.Tensor, grid: tuple[int, int, int]) -> ImageFeatures:
        """Features of one image (or video) whose ``P = t·h·w`` patches are ``pixels_P_F``."""
        spec, w = self.spec, self.weights
        t, h, wd = grid
        if pixels_P_F.shape != (t * h * wd, spec.patch_features):
            raise ValueError(f"pixels {tuple(pixels_P_F.shape)} do not fit grid {grid}")
        x_P_D = F.linear(pixels_P_F.to(w.patch_D_F.dtype), w.patch_D_F, w.patch_b)
        x_P_D = x_P_D + self._positions(h, wd).repeat(t, 1).to(x_P_D.dtype)
        cos, sin = self._rotary(h, wd, t)
        deepstack = []
        for i, block in enumerate(w.blocks):
            x_P_D = self._block(block, x_P_D, cos, sin, frame=h * wd)
            if i in spec.deepstack_indexes:
                merger = w.deepstack[spec.deepstack_indexes.index(i)]
                deepstack.append(self._merge(merger, x_P_D, post_shuffle=True))
        return ImageFeatures(self._merge(w.merger, x_P_D, post_shuffle=False), tuple(deepstack))

    def _positions(self, h: int, w: int) -> torch.Tensor:
        """The learned grid resampled to ``h × w`` patches (bilinear, align_corners), in
        merge-block order: ``[h·w, D]``."""
        side, m = self.spec.grid_side, self.spec.spatial_merge_size
        table = self.weights.pos_embed_N_D
        rows, cols = _block_order(h, w, m, table.device)

        def taps(index: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
            src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
            floor = torch.floor(src)
            offsets = torch.arange(0, 2, device=index.device)
            tap = (floor.long()[:, None] + offsets).clamp(0, side - 1)
            weight = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
            return tap, weight

        h_tap, h_weight = taps(rows, h)
        w_tap, w_weight = taps(cols, w)
        index = (h_tap[:, :, None] * side + w_tap[:, None, :]).reshape(-1, 4)
        weight = (h_weight[:, :, None] * w_weight[:, None, :]).reshape(-1, 4)
        return (table[index] * weight[:, :, None].to(table.dtype)).sum(1)

    def _rotary(self, h: int, w: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[P, 1, head_dim]`` (fp32) of each patch's (row, column)."""
        rows, cols = _block_order(h, w, self.spec.spatial_merge_size, self._inv_freq.device)
        pos_P_2 = torch.stack([rows, cols], dim=-1).repeat(t, 1)
        freqs = pos_P_2[..., None].float() * self._inv_freq
        hw = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        emb = torch.cat([hw, hw], dim=-1)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]

    def _block(self, b: VisionBlockWeights, x_P_D: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, frame: int) -> torch.Tensor:
        spec = self.spec
        rows, d = x_P_D.shape
        h = F.layer_norm(x_P_D, (d,), b.norm1_w, b.norm1_b, LAYER_NORM_EPS)
        q, k, v = F.linear(h, b.qkv_w, b.qkv_b).reshape(rows, 3, spec.num_heads, -1).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        outs = []
        for start in range(0, rows, frame):  # each frame attends to itself (HF's cu_seqlens)
            part = slice(start, start + frame)
            outs.append(F.scaled_dot_product_attention(
                q[part].transpose(0, 1), k[part].transpose(0, 1), v[part].transpose(0, 1),
                scale=spec.head_dim ** -0.5).transpose(0, 1))
        x_P_D = x_P_D + F.linear(torch.cat(outs).reshape(rows, d), b.proj_w, b.proj_b)
        h = F.layer_norm(x_P_D, (d,), b.norm2_w, b.norm2_b, LAYER_NORM_EPS)
        h = F.gelu(F.linear(h, b.fc1_w, b.fc1_b), approximate=_approximate(spec.hidden_act))
        return x_P_D + F.linear(h, b.fc2_w, b.fc2_b)

    def _merge(self, m: MergerWeights, x_P_D: torch.Tensor, post_shuffle: bool) -> torch.Tensor:
        wide = x_P_D.shape[1] * self.spec.spatial_merge_size ** 2
        if post_shuffle:
            x = F.layer_norm(x_P_D.reshape(-1, wide), (wide,), m.norm_w, m.norm_b,
                             LAYER_NORM_EPS)
        else:
            x = F.layer_norm(x_P_D, (x_P_D.shape[1],), m.norm_w, m.norm_b,
                             LAYER_NORM_EPS).reshape(-1, wide)
        return F.linear(F.gelu(F.linear(x, m.fc1_w, m.fc1_b)), m.fc2_w, m.fc2_b)


def _block_order(h: int, w: int, m: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of every patch in merge-block order (``m × m`` groups, row-major)."""
    rows, cols = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device),
                                indexing="ij")
    shape = (h // m, m, w // m, m)
    return (rows.reshape(shape).transpose(1, 2).flatten(),
            cols.reshape(shape).transpose(1, 2).flatten())


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's ``apply_rotary_pos_emb_vision``: in fp32, back to the input dtype."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def _approximate(act: str) -> str:
    return "tanh" if act == "gelu_pytorch_tanh" else "none"
