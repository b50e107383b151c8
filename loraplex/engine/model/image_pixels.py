"""Encoded image bytes → the Qwen2-VL / Qwen3-VL / Qwen3.5 vision tower's input patches.

Reproduces transformers 5.24's ``Qwen2VLImageProcessorPil`` value for value: RGB with alpha
composited onto white, ``smart_resize`` to multiples of ``patch_size × merge_size``, a Pillow
bicubic resize of the uint8 image, rescale by 1/255 (in float64, then float32), normalize in
float32, one frame repeated ``temporal_patch_size`` times, flattened merge-block-major.
(Qwen3-VL and Qwen3.5 map to ``Qwen2VLImageProcessor``, its torchvision twin, and fall back to
this one without torchvision; the twin resizes tensors, not bit-identically to Pillow.)
The bytes were checked (format, size, decodability) by ``loraplex.api.image_check`` before they
were queued; this module knows no HTTP and no tenants.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from loraplex.domain.pixel_spec import (
    MAX_ASPECT_RATIO,
    PixelSpec,
    image_grid,
    num_image_tokens,
    smart_resize,
)

__all__ = ["MAX_ASPECT_RATIO", "PixelSpec", "image_grid", "image_patches", "num_image_tokens",
           "smart_resize"]

#: uint8 → [0, 1]; the processors' ``rescale_factor``.
RESCALE_FACTOR = 1 / 255
def image_patches(data: bytes, spec: PixelSpec, *,
                  field: str = "image") -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Decode, resize, normalise and patch one image.

    Args:
        data: PNG or JPEG bytes (checked by the API layer).
        spec: the checkpoint's pixel spec.
        field: names the image in a refusal.

    Returns:
        ``pixels_P_F``: float32 ``[t·h·w, 3·temporal·patch·patch]``, patches in HF's order
        (for each merge block row-major, its ``merge × merge`` patches row-major; each patch
        channel, frame, row, column); and the (t, h, w) grid.
    """
    with Image.open(io.BytesIO(data)) as image:
        rgb = _to_rgb(image)
    grid = image_grid(rgb.width, rgb.height, spec, field=field)
    _, grid_h, grid_w = grid
    p = spec.patch_size
    # PIL sizes are (width, height); bicubic on uint8, as the PIL backend resizes.
    resized = rgb.resize((grid_w * p, grid_h * p), resample=Image.Resampling.BICUBIC)
    pixels_H_W_C = (np.asarray(resized).astype(np.float64) * RESCALE_FACTOR).astype(np.float32)
    mean_C = np.array(spec.image_mean, dtype=np.float32)
    std_C = np.array(spec.image_std, dtype=np.float32)
    pixels_C_H_W = torch.from_numpy(((pixels_H_W_C - mean_C) / std_C).transpose(2, 0, 1).copy())
    return _patchify(pixels_C_H_W, spec), grid


def _to_rgb(image: Image.Image) -> Image.Image:
    """transformers' ``convert_to_rgb``: transparency composited onto white, else a plain
    conversion (so a transparent pixel's hidden colour never leaks into the patches)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _patchify(pixels_C_H_W: torch.Tensor, spec: PixelSpec) -> torch.Tensor:
    """``[C, H, W]`` → ``pixels_P_F``, the processor's ``patchify``."""
    c, height, width = pixels_C_H_W.shape
    p, m, t = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    blocks = pixels_C_H_W.reshape(c, grid_h // m, m, p, grid_w // m, m, p)
    # (block row, block col, row in block, col in block, C, patch row, patch col)
    blocks = blocks.permute(1, 4, 2, 5, 0, 3, 6).unsqueeze(5)
    frames = blocks.expand(*blocks.shape[:5], t, p, p)
    return frames.reshape(grid_h * grid_w, c * t * p * p).contiguous()
