"""`ImageEncoder`: a request's `ImageInput`s → the `ImageSpan`s packed batches take (decoded,
patched and run through the vision tower once per distinct image: the features of the last
`CACHE_IMAGES` images are kept, so a group's samples, every decode step and a prompt seen
again reuse them).

The API layer computed each image's grid from its header; the decoded image must give the
same grid here (a mismatch would misplace its tokens: refused).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from loraplex.domain.image import ImageInput
from loraplex.domain.pixel_spec import PixelSpec
from loraplex.engine.model.image_pixels import image_patches
from loraplex.engine.model.image_rows import ImageSpan
from loraplex.engine.model.vision import ImageFeatures, VisionTower
from loraplex.errors import user_error

CACHE_IMAGES = 64


class ImageEncoder:
    """A model's vision tower with its pixel spec and a feature cache."""

    def __init__(self, tower: VisionTower, pixels: PixelSpec) -> None:
        self.tower = tower
        self.pixels = pixels
        self._cache: OrderedDict[str, ImageFeatures] = OrderedDict()
        self._lock = threading.Lock()

    def spans(self, images: Sequence[ImageInput]) -> tuple[ImageSpan, ...]:
        return tuple(ImageSpan(image.offset, image.grid_llm, self.features(image))
                     for image in images)

    def features(self, image: ImageInput) -> ImageFeatures:
        with self._lock:
            hit = self._cache.get(image.digest)
            if hit is not None:
                self._cache.move_to_end(image.digest)
                return hit
        pixels_P_F, grid = image_patches(image.data, self.pixels)
        if grid != image.grid:
            raise user_error("images", f"image decodes to grid {grid}, not {image.grid}")
        device = self.tower.weights.patch_D_F.device
        features = self.tower(pixels_P_F.to(device), grid)
        with self._lock:
            self._cache[image.digest] = features
            while len(self._cache) > CACHE_IMAGES:
                self._cache.popitem(last=False)
        return features
