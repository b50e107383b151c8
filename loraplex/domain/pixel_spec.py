"""`PixelSpec`: how a checkpoint's images become patches, and the token grid an image of a given
size takes (transformers' ``smart_resize``): what the API layer needs to count an image's
tokens and check a client's ``expected_tokens`` before anything is decoded. Knows no tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.errors import user_error

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
