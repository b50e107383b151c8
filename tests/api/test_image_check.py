"""Untrusted image bytes: good PNGs and JPEGs pass with their size; every bad case (empty, too
big, wrong or unsupported format, zero or absurd sizes, a decompression bomb refused from its
header alone, truncated or corrupt data) is a user error naming the field."""

from __future__ import annotations

import contextlib
import io
import re
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from loraplex.api.image_check import decode_check, probe_image
from loraplex.errors import UserError

FIELD = "model_input.chunks[1]"
LIMITS = dict(max_pixels=4096 * 4096, max_bytes=10_000_000)
DECODE_FAILED = rf"^{re.escape(FIELD)}: image could not be decoded: "


def encoded(width: int, height: int, fmt: str, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(width * 31 + height)
    channels = 4 if mode == "RGBA" else 3
    array = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format=fmt)
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A PNG signature and a valid IHDR (correct CRC) claiming ``width × height``, then one tiny
    IDAT and IEND: what a decompression bomb's header looks like."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b""))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real JPEG with its start-of-frame size rewritten."""
    data = bytearray(encoded(16, 16, "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def refused(data: bytes, fmt: str, match: str, **limits: int) -> UserError:
    with pytest.raises(UserError, match=match) as info:
        probe_image(data, fmt, FIELD, **{**LIMITS, **limits})
    assert info.value.field == FIELD
    assert str(info.value).startswith(FIELD)
    return info.value


@pytest.mark.parametrize(("fmt", "declared"), [("PNG", "png"), ("JPEG", "jpeg")])
@pytest.mark.parametrize("size", [(37, 53), (1, 1), (500, 120), (33, 1000)])
def test_good_images_pass_with_their_size(fmt: str, declared: str, size: tuple[int, int]) -> None:
    data = encoded(*size, fmt)
    assert probe_image(data, declared, FIELD, **LIMITS) == size
    decode_check(data, FIELD)


def test_transparent_png_passes() -> None:
    data = encoded(20, 10, "PNG", mode="RGBA")
    assert probe_image(data, "png", FIELD, **LIMITS) == (20, 10)
    decode_check(data, FIELD)


def test_empty_and_oversized_bytes_are_refused() -> None:
    refused(b"", "png", "empty")
    data = encoded(64, 64, "PNG")
    refused(data, "png", rf"{len(data)} bytes, over the limit of 100", max_bytes=100)


def test_unsupported_declared_format_is_refused() -> None:
    refused(encoded(8, 8, "PNG"), "gif", r"unsupported image format 'gif'.*\['jpeg', 'png'\]")
    refused(encoded(8, 8, "JPEG"), "jpg", "unsupported image format 'jpg'")


def test_bytes_of_another_format_than_declared_are_refused() -> None:
    refused(encoded(8, 8, "JPEG"), "png", "declared format is png but the bytes are jpeg")
    refused(encoded(8, 8, "PNG"), "jpeg", "declared format is jpeg but the bytes are png")
    refused(encoded(8, 8, "GIF"), "png", "declared format is png but the bytes are gif")
    refused(encoded(8, 8, "WEBP"), "jpeg", "declared format is jpeg but the bytes are webp")
    refused(b"hello world", "png", "bytes are not a recognised image format")


def test_a_bomb_header_is_refused_before_decoding() -> None:
    bomb = png_claiming(100000, 100000)
    start = time.perf_counter()
    refused(bomb, "png", r"100000×100000.*over 65535")
    refused(png_claiming(60000, 60000), "png", r"3600000000 pixels, over the limit")
    refused(jpeg_claiming(60000, 60000), "jpeg", r"60000×60000 = 3600000000 pixels")
    assert time.perf_counter() - start < 0.5
    refused(png_claiming(300, 300), "png", "over the limit of 10000", max_pixels=10000)


def test_pillows_own_bomb_bound_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a stricter Pillow bound than ours, probe stays under it (Pillow never warns) and
    decode turns Pillow's DecompressionBombError into the same user error."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    data = encoded(40, 40, "PNG")
    refused(data, "png", "1600 pixels, over the limit of 100")
    with pytest.raises(UserError, match=DECODE_FAILED + ".*bomb"):
        decode_check(data, FIELD)


def test_zero_dimensions_are_refused() -> None:
    refused(png_claiming(0, 0), "png", r"zero dimension \(0×0\)")
    refused(png_claiming(10, 0), "png", r"zero dimension \(10×0\)")
    refused(jpeg_claiming(0, 16), "jpeg", r"zero dimension \(0×16\)")


def test_a_truncated_header_is_refused() -> None:
    refused(encoded(8, 8, "PNG")[:20], "png", "png header is truncated or malformed")
    jpeg = encoded(8, 8, "JPEG")
    refused(jpeg[:jpeg.index(b"\xff\xc0")], "jpeg", "jpeg header is truncated or malformed")


def test_a_header_with_a_bad_crc_is_refused_by_pillow() -> None:
    data = bytearray(png_claiming(10, 10))
    data[29] ^= 0xFF  # the IHDR CRC
    refused(bytes(data), "png", "png header could not be read")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_images_pass_the_probe_and_fail_the_decode(fmt: str) -> None:
    data = encoded(120, 90, fmt)
    truncated = data[:len(data) // 2]
    assert probe_image(truncated, fmt.lower(), FIELD, **LIMITS) == (120, 90)
    with pytest.raises(UserError, match=DECODE_FAILED + "image file is truncated") as info:
        decode_check(truncated, FIELD)
    assert info.value.field == FIELD


def test_corrupt_png_data_fails_the_decode() -> None:
    data = bytearray(encoded(64, 64, "PNG"))
    idat = data.index(b"IDAT")
    data[idat + 10:idat + 60] = b"\x00" * 50  # damage the compressed stream
    with pytest.raises(UserError, match="could not be decoded"):
        decode_check(bytes(data), FIELD)


def test_pillow_state_is_left_alone() -> None:
    before = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
    for data, fmt in [(png_claiming(100000, 100000), "png"), (encoded(9, 9, "JPEG"), "jpeg")]:
        with contextlib.suppress(UserError):
            probe_image(data, fmt, FIELD, **LIMITS)
            decode_check(data, FIELD)
    assert before == (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
