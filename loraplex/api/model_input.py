"""Model inputs with images: an SDK ``ModelInput`` (JSON) or a wire datum's chunks (protobuf)
→ one token array in which each image is a run of the model's image placeholder token, plus an
`ImageInput` per image.

Every image is checked before anything is queued, in two steps: `checked_chunk` (no model
needed: format, header size against ``limits.max_image_pixels``, then a full decode: run off
the event loop, by the codec's thread or `check_prompt_images`) and `placed` (the model's
patch grid from the header size, the client's ``expected_tokens`` compared with it, the
placeholder run within the context). Errors name the chunk (``prompt.chunks[1]``).
"""

from __future__ import annotations

import base64
from array import array
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tinker import types as sdk

from loraplex.api.image_check import decode_check, probe_image
from loraplex.config import LimitsConfig
from loraplex.domain.data import Datum
from loraplex.domain.image import ImageChunkIn, ImageFormat, ImageInput
from loraplex.domain.model import ModelInfo
from loraplex.domain.pixel_spec import image_grid, num_image_tokens
from loraplex.errors import user_error


def checked_chunk(data: bytes, fmt: str, expected_tokens: int | None, at: int, field: str,
                  limits: LimitsConfig, decode: bool = True) -> ImageChunkIn:
    """One image chunk's bytes checked without a model (``decode``: a full decode too)."""
    width, height = probe_image(data, fmt, field, max_pixels=limits.max_image_pixels,
                                max_bytes=limits.max_image_bytes)
    if decode:
        decode_check(data, field)
    if expected_tokens is not None and (isinstance(expected_tokens, bool)
                                        or not 0 < expected_tokens < 1 << 31):
        raise user_error(f"{field}.expected_tokens", f"must be a positive integer, got "
                         f"{expected_tokens!r}")
    image_format: ImageFormat = "png" if fmt == "png" else "jpeg"
    return ImageChunkIn(data, image_format, (width, height), expected_tokens, at, field)


def placed(chunks: Sequence[ImageChunkIn], text: Sequence[int], info: ModelInfo
           ) -> tuple[array[int], tuple[ImageInput, ...]]:
    """The full token array (each image's placeholder run inserted where it stood among the
    text tokens) and the images."""
    if chunks and (info.pixels is None or info.image_token_id is None):
        raise user_error(chunks[0].field, f"this {info.arch} model takes no images")
    tokens, images, done = array("q"), [], 0
    for chunk in chunks:
        assert info.pixels is not None and info.image_token_id is not None
        tokens.extend(text[done:chunk.at])
        done = chunk.at
        grid = image_grid(*chunk.size, info.pixels, field=chunk.field)
        count = num_image_tokens(grid, info.pixels.merge_size)
        if chunk.expected_tokens is not None and chunk.expected_tokens != count:
            raise user_error(f"{chunk.field}.expected_tokens",
                             f"{chunk.expected_tokens}, but this model makes {count} tokens of "
                             f"a {chunk.size[0]}×{chunk.size[1]} image")
        images.append(ImageInput(chunk.data, chunk.format, chunk.size, grid,
                                 info.pixels.merge_size, len(tokens)))
        tokens.extend([info.image_token_id] * count)
    tokens.extend(text[done:])
    return tokens, tuple(images)


def placed_datum(datum: Datum, info: ModelInfo) -> Datum:
    """A decoded datum with its pending image chunks placed (unchanged without any)."""
    if not datum.pending_images:
        return datum
    tokens, images = placed(datum.pending_images, datum.tokens, info)
    return replace(datum, tokens=tokens, images=images, pending_images=())


def prompt_chunks(prompt: sdk.ModelInput, field: str, limits: LimitsConfig,
                  decode: bool) -> tuple[list[int], list[ImageChunkIn]]:
    """A JSON prompt's text tokens and checked image chunks (``decode``: decoded fully too;
    the route has done that off the event loop already when False)."""
    text: list[int] = []
    chunks: list[ImageChunkIn] = []
    for j, chunk in enumerate(prompt.chunks):
        where = f"{field}.chunks[{j}]"
        if isinstance(chunk, sdk.EncodedTextChunk):
            text.extend(chunk.tokens)
        elif isinstance(chunk, sdk.ImageChunk):
            chunks.append(checked_chunk(chunk.data, chunk.format, chunk.expected_tokens,
                                        len(text), where, limits, decode))
        elif isinstance(chunk, sdk.ImageAssetPointerChunk):
            raise user_error(where, "image_asset_pointer chunks are not fetched by this "
                             "server: send the bytes as an image chunk")
        else:
            raise user_error(where, f"{getattr(chunk, 'type', 'non-text')} chunks are not "
                             "supported")
    return text, chunks


def check_prompt_images(prompt: sdk.ModelInput | None, limits: LimitsConfig,
                        field: str = "prompt") -> None:
    """Decode every image of a prompt once (run off the event loop before the request is
    prepared): a corrupt one is a 400 naming its chunk."""
    if prompt is None:
        return
    for j, chunk in enumerate(prompt.chunks):
        if isinstance(chunk, sdk.ImageChunk):
            checked_chunk(chunk.data, chunk.format, chunk.expected_tokens, 0,
                          f"{field}.chunks[{j}]", limits)


def has_images(prompt: Any) -> bool:
    return any(isinstance(c, sdk.ImageChunk) for c in getattr(prompt, "chunks", ()))


def data_url_image(url: str, field: str) -> tuple[bytes, str]:
    """An OpenAI ``image_url`` part's ``data:image/png;base64,…`` URL → (bytes, format);
    remote URLs are not fetched."""
    head, sep, payload = url.partition(",")
    if not url.startswith("data:") or not sep:
        raise user_error(field, "only data: URLs are accepted (this server fetches nothing)")
    media = head.removeprefix("data:")
    kinds = {"image/png;base64": "png", "image/jpeg;base64": "jpeg",
             "image/jpg;base64": "jpeg"}
    if media not in kinds:
        raise user_error(field, f"unsupported data URL type {media!r} (base64 PNG or JPEG)")
    try:
        return base64.b64decode(payload, validate=True), kinds[media]
    except ValueError:
        raise user_error(field, "data URL is not valid base64") from None
