"""Image bytes → vision-tower patches, against transformers 5.24's processor for Qwen3-VL.

``AutoImageProcessor`` on Qwen3-VL's ``preprocessor_config.json`` gives ``Qwen2VLImageProcessor``
(torchvision) when torchvision is installed and ``Qwen2VLImageProcessorPil`` otherwise; the
reference here is the PIL one, which our pixels equal exactly (same Pillow resize, same float
path). Images are random-colour PNGs and JPEGs of odd sizes made in the test, some with
transparency or in grey, with the default pixel bounds and with small ones that force
down- and up-scaling.
"""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    Qwen2VLImageProcessorPil,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    smart_resize as hf_smart_resize,
)

from loraplex.engine.model.image_pixels import (
    PixelSpec,
    image_grid,
    image_patches,
    num_image_tokens,
    smart_resize,
)
from loraplex.errors import UserError

#: Qwen/Qwen3-VL-*'s preprocessor_config.json, as published.
QWEN3_VL_PREPROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
    "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast"}
QWEN3_VL_VISION = {"patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2}
SIZES = [(37, 53), (224, 224), (500, 120), (33, 1000), (1, 150), (641, 479)]  # (width, height)
#: (min_pixels, max_pixels): Qwen3-VL's, and small ones that shrink or grow every image.
BOUNDS = [(65536, 16777216), (1024, 8192), (32 * 32, 32 * 32 * 4), (50000, 60000)]


def encoded(width: int, height: int, fmt: str, mode: str = "RGB", seed: int = 0) -> bytes:
    """A random-colour (per-pixel noise) image, encoded."""
    rng = np.random.default_rng(seed + width * 7919 + height)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    noise = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    array = noise[..., 0] if mode == "L" else noise
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format=fmt.upper())
    return buffer.getvalue()


def hf_processor(tmp_path: Path, min_pixels: int, max_pixels: int) -> Any:
    config = dict(QWEN3_VL_PREPROCESSOR,
                  size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    return AutoImageProcessor.from_pretrained(tmp_path)


def hf_reference(processor: Any, data: bytes) -> tuple[np.ndarray, tuple[int, ...]]:
    with Image.open(io.BytesIO(data)) as image:
        out = processor(images=[image], return_tensors="np")
    return out["pixel_values"], tuple(int(v) for v in out["image_grid_thw"][0])


def test_defaults_are_qwen3_vls_preprocessor_config(tmp_path: Path) -> None:
    processor = hf_processor(tmp_path, 65536, 16777216)
    spec = PixelSpec()
    assert (spec.patch_size, spec.temporal_patch_size, spec.merge_size) == (
        processor.patch_size, processor.temporal_patch_size, processor.merge_size)
    assert (spec.min_pixels, spec.max_pixels) == (
        processor.size.shortest_edge, processor.size.longest_edge)
    assert spec.image_mean == tuple(processor.image_mean)
    assert spec.image_std == tuple(processor.image_std)
    assert PixelSpec.from_config(QWEN3_VL_VISION) == spec
    assert PixelSpec.from_config(QWEN3_VL_VISION, QWEN3_VL_PREPROCESSOR) == spec


def test_from_config_reads_the_vision_config_and_preprocessor_overrides() -> None:
    spec = PixelSpec.from_config(
        {"patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2},
        {"min_pixels": 3136, "max_pixels": 12845056, "size": {"shortest_edge": 1},
         "image_mean": [0.48, 0.45, 0.4], "image_std": [0.26, 0.26, 0.27]})
    assert (spec.patch_size, spec.factor, spec.patch_features) == (14, 28, 3 * 2 * 14 * 14)
    assert (spec.min_pixels, spec.max_pixels) == (3136, 12845056)
    assert spec.image_mean == (0.48, 0.45, 0.4)
    with pytest.raises(UserError, match=r"vision_config\.patch_size.*positive"):
        PixelSpec.from_config({"patch_size": 0})
    with pytest.raises(UserError, match="image_std"):
        PixelSpec.from_config(QWEN3_VL_VISION, {"image_std": [0.5]})


@pytest.mark.parametrize("bounds", BOUNDS)
def test_smart_resize_and_grid_equal_transformers(bounds: tuple[int, int]) -> None:
    min_pixels, max_pixels = bounds
    spec = PixelSpec(min_pixels=min_pixels, max_pixels=max_pixels)
    for width, height in [*SIZES, (4000, 3000), (28, 28), (5000, 25), (16, 16)]:
        expected = hf_smart_resize(height, width, factor=32, min_pixels=min_pixels,
                                   max_pixels=max_pixels)
        assert smart_resize(height, width, spec) == expected, (width, height)
        grid = image_grid(width, height, spec)
        assert grid == (1, expected[0] // 16, expected[1] // 16)
        assert num_image_tokens(grid, 2) == expected[0] * expected[1] // 32 ** 2


def test_smart_resize_refuses_extreme_aspect_and_zero_sides() -> None:
    with pytest.raises(UserError, match=r"chunks\[2\].*aspect ratio"):
        smart_resize(1, 201, PixelSpec(), field="chunks[2]")
    with pytest.raises(UserError, match="zero side"):
        image_grid(0, 10, PixelSpec())


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
@pytest.mark.parametrize("bounds", BOUNDS)
def test_patches_equal_transformers_pixel_values(
    tmp_path: Path, fmt: str, bounds: tuple[int, int],
) -> None:
    processor = hf_processor(tmp_path, *bounds)
    assert isinstance(processor, Qwen2VLImageProcessorPil)  # no torchvision: the PIL path
    spec = PixelSpec(min_pixels=bounds[0], max_pixels=bounds[1])
    for width, height in SIZES:
        data = encoded(width, height, fmt)
        pixels_P_F, grid = image_patches(data, spec)
        expected, expected_grid = hf_reference(processor, data)
        assert grid == expected_grid, (width, height)
        assert pixels_P_F.dtype == torch.float32
        assert tuple(pixels_P_F.shape) == (grid[0] * grid[1] * grid[2], spec.patch_features)
        assert torch.equal(pixels_P_F, torch.from_numpy(expected)), (width, height)


@pytest.mark.parametrize("mode", ["RGBA", "L"])
def test_transparency_and_grey_follow_transformers(tmp_path: Path, mode: str) -> None:
    processor = hf_processor(tmp_path, 1024, 8192)
    spec = PixelSpec(min_pixels=1024, max_pixels=8192)
    data = encoded(61, 45, "png", mode=mode, seed=3)
    pixels_P_F, grid = image_patches(data, spec)
    expected, expected_grid = hf_reference(processor, data)
    assert grid == expected_grid
    assert torch.equal(pixels_P_F, torch.from_numpy(expected))


def test_patch_order_is_merge_block_major() -> None:
    """Patch k of merge block (bi, bj) is pixel block (2·bi + k // 2, 2·bj + k % 2), each frame
    the same; checked on an image whose resize is the identity (64×32 pixels)."""
    spec = PixelSpec(min_pixels=16, max_pixels=64 * 64)
    rng = np.random.default_rng(1)
    array = rng.integers(0, 256, (32, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    pixels_P_F, grid = image_patches(buffer.getvalue(), spec)
    assert grid == (1, 2, 4)
    image_C_H_W = (torch.from_numpy(array).permute(2, 0, 1).double() / 255 - 0.5) / 0.5
    patches = pixels_P_F.reshape(1, 2, 2, 2, 3, 2, 16, 16)  # bi, bj, mi, mj, C, T, ph, pw
    for bi, bj, mi, mj, frame in itertools.product(range(1), range(2), range(2), range(2),
                                                   range(2)):
        row, col = (2 * bi + mi) * 16, (2 * bj + mj) * 16
        block = image_C_H_W[:, row:row + 16, col:col + 16].float()
        assert torch.allclose(patches[bi, bj, mi, mj, :, frame], block, atol=1e-6)
