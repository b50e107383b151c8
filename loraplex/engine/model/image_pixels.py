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
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from loraplex.errors import user_error

#: uint8 → [0, 1]; the processors' ``rescale_factor``.
RESCALE_FACTOR = 1 / 255
#: smart_resize refuses images longer than this many times their width (or the reverse).
MAX_ASPECT_RATIO = 200
_VISION = "config.vision_config"


@dataclass(frozen=True)
class PixelSpec:
    """How an image becomes patches; the defaults are Qwen3-VL's ``preprocessor_config.json``.

    Attributes:
        patch_size: pixels per patch side (the Conv3d's spatial kernel).
        temporal_patch_size: frames per patch; an image is its one frame repeated this often.
        merge_size: patches per side merged into one language-model token.
        min_pixels, max_pixels: bounds on the resized area (``size.shortest_edge`` /
            ``size.longest_edge`` in the processor config, despite their names).
        image_mean, image_std: per-channel normalisation of the [0, 1] RGB values.
    """

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this: one merged token's side in pixels."""
        return self.patch_size * self.merge_size

    @property
    def patch_features(self) -> int:
        """Values per patch: channels × frames × pixels."""
        return 3 * self.temporal_patch_size * self.patch_size ** 2

    @classmethod
    def from_config(cls, vision_config: Mapping[str, Any],
                    preprocessor: Mapping[str, Any] | None = None) -> PixelSpec:
        """The spec of a checkpoint: patch geometry from ``config.json``'s ``vision_config``
        (transformers' config defaults where a key is absent), pixel bounds and normalisation
        from ``preprocessor_config.json`` when given, else Qwen3-VL's.

        Raises:
            UserError: a non-positive or non-integer size.
        """
        pre, default = preprocessor or {}, cls()
        size = pre.get("size") or {}
        # A top-level min_pixels / max_pixels wins over size{}, as in the processor's __init__.
        min_pixels = pre.get("min_pixels", size.get("shortest_edge", default.min_pixels))
        max_pixels = pre.get("max_pixels", size.get("longest_edge", default.max_pixels))
        spec = cls(
            patch_size=_positive(vision_config.get("patch_size", 16), f"{_VISION}.patch_size"),
            temporal_patch_size=_positive(vision_config.get("temporal_patch_size", 2),
                                          f"{_VISION}.temporal_patch_size"),
            merge_size=_positive(vision_config.get("spatial_merge_size", 2),
                                 f"{_VISION}.spatial_merge_size"),
            min_pixels=_positive(min_pixels, "preprocessor.size.shortest_edge"),
            max_pixels=_positive(max_pixels, "preprocessor.size.longest_edge"),
            image_mean=_triple(pre.get("image_mean", default.image_mean), "image_mean"),
            image_std=_triple(pre.get("image_std", default.image_std), "image_std"))
        if spec.min_pixels > spec.max_pixels:
            raise user_error("preprocessor.size", "shortest_edge (min pixels) is over "
                             "longest_edge (max pixels)")
        return spec


def smart_resize(height: int, width: int, spec: PixelSpec, *,
                 field: str = "image") -> tuple[int, int]:
    """transformers' ``smart_resize``: the (height, width) nearest the image's own whose sides
    are multiples of ``spec.factor`` and whose area lies in [min_pixels, max_pixels], keeping
    the aspect ratio as well as those allow.

    Raises:
        UserError: a zero side, or an aspect ratio over ``MAX_ASPECT_RATIO`` (named ``field``).
    """
    if height <= 0 or width <= 0:
        raise user_error(field, f"has a zero side ({width}×{height})")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise user_error(field, f"aspect ratio {width}×{height} is over {MAX_ASPECT_RATIO}:1")
    factor = spec.factor
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > spec.max_pixels:
        beta = math.sqrt((height * width) / spec.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_grid(width: int, height: int, spec: PixelSpec, *,
               field: str = "image") -> tuple[int, int, int]:
    """The (t, h, w) patch grid of a ``width × height`` image (HF's ``image_grid_thw``)."""
    resized_h, resized_w = smart_resize(height, width, spec, field=field)
    return 1, resized_h // spec.patch_size, resized_w // spec.patch_size


def num_image_tokens(grid: tuple[int, int, int], merge_size: int) -> int:
    """Language-model tokens of an image: its patches, ``merge_size²`` to a token."""
    t, h, w = grid
    return t * h * w // merge_size ** 2


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


def _positive(value: Any, field: str) -> int:
    if isinstance(value, (list, tuple)) and len(set(value)) == 1:  # [p, p]: square patches
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise user_error(field, f"must be a positive integer, got {value!r}")
    return value


def _triple(value: Any, key: str) -> tuple[float, float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise user_error(f"preprocessor.{key}", f"must be three numbers, got {value!r}")
    first, second, third = (float(v) for v in value)
    return first, second, third
