"""`ImageInput`: one image of a model input, as the engine receives it.

Tinker's ``ModelInput`` interleaves text chunks and image chunks; the API layer flattens it into
one token array in which each image stands as ``num_tokens`` copies of the model's image
placeholder token (``<|image_pad|>``), the way the HF processors expand it, and lists the images
here with where their placeholders start. The bytes stay encoded (PNG or JPEG, checked by the
API before anything is queued); the engine decodes and resizes them to ``grid``. Knows no
tensors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

ImageFormat = Literal["png", "jpeg"]


@dataclass(frozen=True)
class ImageInput:
    """An image at ``offset`` in its sequence's tokens.

    Attributes:
        data: the encoded bytes as the client sent them.
        format: ``png`` or ``jpeg`` (checked against the bytes).
        size: the (width, height) to resize to before patching: the decoded size, or the
            chunk's ``override_dimensions``.
        grid: the vision tower's (t, h, w) patch grid (``t = 1`` for an image).
        merge: patches merged into one token per side (``spatial_merge_size``).
        offset: index of its first placeholder token in the sequence.
    """

    data: bytes
    format: ImageFormat
    size: tuple[int, int]
    grid: tuple[int, int, int]
    merge: int
    offset: int

    @property
    def num_tokens(self) -> int:
        """Placeholder tokens it takes: merged patches, ``t·h·w / merge²``."""
        t, h, w = self.grid
        return t * h * w // (self.merge * self.merge)

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens

    @property
    def grid_llm(self) -> tuple[int, int, int]:
        """Its token grid as the language model's positions see it (merged)."""
        t, h, w = self.grid
        return t, h // self.merge, w // self.merge

    @cached_property
    def digest(self) -> str:
        """Identity of the pixels it yields (bytes, size, grid): prefix-cache and feature-cache
        keys, so equal placeholder tokens of different images never share keys/values."""
        h = hashlib.sha256(self.data)
        h.update(repr((self.format, self.size, self.grid, self.merge)).encode())
        return h.hexdigest()


@dataclass(frozen=True)
class ImageChunkIn:
    """An image chunk as decoded from the wire, checked (format, header size, decodable) but
    not yet placed: its token count depends on the model it goes to.

    Attributes:
        data, format: the bytes and their (verified) format.
        size: (width, height) from its header.
        expected_tokens: the client's count (None: not sent); must equal the model's.
        at: the number of text tokens before it in its model input.
        field: where it came from (``data[2].model_input.chunks[1]``), for errors.
    """

    data: bytes
    format: ImageFormat
    size: tuple[int, int]
    expected_tokens: int | None
    at: int
    field: str
