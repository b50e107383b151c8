"""Untrusted image bytes, checked before anything is queued: the declared format against the
bytes, the size from the header alone (a decompression bomb is refused before a pixel is
decoded), then one full decode that catches truncated or corrupt data.

Only PNG and JPEG are accepted, and Pillow is only ever asked to open those two formats. Pillow's
global state (``MAX_IMAGE_PIXELS``, ``LOAD_TRUNCATED_IMAGES``, warning filters) is read, never
changed. Knows nothing of models or patches (``loraplex.engine.model.image_pixels`` does).
"""

from __future__ import annotations

import io
import struct

from PIL import Image

from loraplex.errors import UserError, user_error

#: Declared format → Pillow's name for it.
FORMATS = {"png": "PNG", "jpeg": "JPEG"}
#: Longest side accepted whatever the pixel budget (JPEG's own limit; no real image is longer).
MAX_SIDE = 65535

#: Leading bytes of the formats we can name in a refusal.
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF87a", "gif"),
          (b"GIF89a", "gif"), (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))
#: JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they hold the size.
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
#: JPEG markers without a length: start of image, TEM and the restart markers.
_STANDALONE = frozenset({0xD8, 0x01, *range(0xD0, 0xD8)})
#: What Pillow raises on bad bytes (UnidentifiedImageError is an OSError).
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error,
               Image.DecompressionBombError)


def probe_image(data: bytes, fmt: str, field: str, *, max_pixels: int,
                max_bytes: int) -> tuple[int, int]:
    """The image's (width, height), read from its header without decoding it.

    Args:
        data: the encoded bytes, as the client sent them.
        fmt: the declared format (``png`` or ``jpeg``).
        field: the request field the image came from, named in every refusal.
        max_pixels: most pixels (width × height) a decoded image may hold.
        max_bytes: most encoded bytes.

    Raises:
        UserError: empty or oversized bytes; a format other than png/jpeg, or bytes of another
            format than declared; a zero, over-long or over-budget size; a malformed header.
    """
    if not data:
        raise user_error(field, "image data is empty")
    if len(data) > max_bytes:
        raise user_error(field, f"image is {len(data)} bytes, over the limit of {max_bytes}")
    if fmt not in FORMATS:
        raise user_error(field, f"unsupported image format {fmt!r}; supported: "
                         f"{sorted(FORMATS)}")
    actual = sniff_format(data)
    if actual != fmt:
        raise user_error(field, f"declared format is {fmt} but the bytes are "
                         f"{actual or 'not a recognised image format'}")
    width, height = _header_size(data, fmt, field)
    _check_size(width, height, field, max_pixels)
    try:
        with Image.open(io.BytesIO(data), formats=[FORMATS[fmt]]) as image:
            size, pil_format = image.size, image.format
    except _PIL_ERRORS as exc:
        raise _unreadable(field, fmt, "header could not be read", exc) from None
    if size != (width, height) or pil_format != FORMATS[fmt]:
        raise user_error(field, f"{fmt} header is inconsistent (size {width}×{height}, "
                         f"Pillow reads {size[0]}×{size[1]} {pil_format})")
    return width, height


def decode_check(data: bytes, field: str) -> None:
    """Decode the whole image once, so truncated or corrupt data fails its request here rather
    than a batch in the engine. Call after ``probe_image`` (which bounds the size).

    Raises:
        UserError: the image could not be decoded.
    """
    try:
        with Image.open(io.BytesIO(data), formats=list(FORMATS.values())) as image:
            image.load()
    except _PIL_ERRORS as exc:
        raise _unreadable(field, "image", "could not be decoded", exc) from None


def sniff_format(data: bytes) -> str | None:
    """The format the leading bytes announce (``png``, ``jpeg``, ``gif``, ``webp``, ...), or
    None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((name for magic, name in _MAGIC if data.startswith(magic)), None)


def _check_size(width: int, height: int, field: str, max_pixels: int) -> None:
    if width <= 0 or height <= 0:
        raise user_error(field, f"image claims a zero dimension ({width}×{height})")
    if max(width, height) > MAX_SIDE:
        raise user_error(field, f"image is {width}×{height}; a side over {MAX_SIDE} pixels is "
                         "refused")
    # Pillow warns above its own bound (and raises above twice it): stay under it so it never
    # does, without touching its global.
    limit = min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels)
    if width * height > limit:
        raise user_error(field, f"image is {width}×{height} = {width * height} pixels, over "
                         f"the limit of {limit} (refused before decoding)")


def _header_size(data: bytes, fmt: str, field: str) -> tuple[int, int]:
    """(width, height) parsed from the raw header, before Pillow sees the bytes."""
    size = _png_size(data) if fmt == "png" else _jpeg_size(data)
    if size is None:
        raise user_error(field, f"{fmt} header is truncated or malformed")
    return size


def _png_size(data: bytes) -> tuple[int, int] | None:
    # Signature (8 bytes), then the IHDR chunk: length 13, type, width, height (big-endian).
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk the marker segments to the first start-of-frame."""
    pos = 2  # past SOI
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        if marker in _SOF:
            if length < 7 or pos + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return width, height
        if marker == 0xDA or length < 2:  # scan data before any frame header
            return None
        pos += 2 + length
    return None


def _unreadable(field: str, what: str, problem: str, exc: BaseException) -> UserError:
    detail = str(exc) or type(exc).__name__
    return user_error(field, f"{what} {problem}: {detail}")
