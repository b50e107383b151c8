"""A quick index of a GGUF file: its metadata and tensor table, tensors as views of a memory map.

The ``gguf`` package's ``GGUFReader`` turns every string of a 49k-token vocabulary into numpy
memmap slices (about 6 s for SmolLM2's header, at every load); this walks the same header
(GGUF v2/v3, little-endian, per the ggml GGUF spec) with ``struct`` in well under a second and
leaves string arrays nobody asked for as their length. Types, block sizes and dequantisation
stay the ``gguf`` package's (`GGMLQuantizationType`, ``GGML_QUANT_SIZES``,
``gguf.quants.dequantize``).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """Not a GGUF file this reader understands."""


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array left unread: only its length is known."""

    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: name, ggml type, numpy view of its bytes (rows × row bytes, as the
    ``gguf`` package's reader shapes it, so ``gguf.quants.dequantize`` takes it as is)."""

    name: str
    tensor_type: Any
    data: np.ndarray


class GGUFIndex:
    """``fields``: metadata key → value (str, int, float, bool, list, or `SkippedArray` for a
    string array not named in ``full_arrays``); ``tensors``: the tensor table, in file order."""

    def __init__(self, path: str | Path, full_arrays: tuple[str, ...] = ()) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        if self._take(4) != MAGIC:
            raise GGUFFormatError("bad magic (not a GGUF file)")
        version = self._unpack("<I")
        num_tensors, num_fields = self._unpack("<Q"), self._unpack("<Q")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} (supported: 2, 3)")
        self.fields: dict[str, Any] = {}
        for _ in range(num_fields):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I"), key in full_arrays)
        table = [self._tensor_entry() for _ in range(num_tensors)]
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._pos // alignment) * alignment
        buffer = np.frombuffer(self._map, dtype=np.uint8)
        self.tensors = [self._tensor(buffer, start, *entry) for entry in table]

    def _take(self, n: int) -> bytes:
        if self._pos + n > len(self._map):
            raise GGUFFormatError("truncated header")
        data = self._map[self._pos:self._pos + n]
        self._pos += n
        return data

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self._take(size))[0]

    def _string(self) -> str:
        return self._take(self._unpack("<Q")).decode("utf-8")

    def _value(self, kind: int, full: bool) -> Any:
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise GGUFFormatError(f"unknown metadata value type {kind}")
        item, count = self._unpack("<I"), self._unpack("<Q")
        if item in _SCALARS:
            fmt = _SCALARS[item]
            data = self._take(struct.calcsize(fmt) * count)
            return list(struct.unpack(f"<{count}{fmt[1]}", data))
        if item == _STRING and not full:
            for _ in range(count):
                self._pos += 8 + struct.unpack_from("<Q", self._map, self._pos)[0]
            return SkippedArray(count)
        return [self._value(item, full) for _ in range(count)]

    def _tensor_entry(self) -> tuple[str, list[int], int, int]:
        name = self._string()
        dims = [self._unpack("<Q") for _ in range(self._unpack("<I"))]
        return name, dims, self._unpack("<I"), self._unpack("<Q")

    def _tensor(self, buffer: np.ndarray, start: int, name: str, dims: list[int], kind: int,
                offset: int) -> TensorInfo:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            qtype = GGMLQuantizationType(kind)
        except ValueError:
            raise GGUFFormatError(f"tensor {name} has unknown ggml type id {kind}") from None
        block, size = GGML_QUANT_SIZES[qtype]
        shape = list(reversed(dims))  # numpy order: the innermost ggml dim last
        if shape[-1] % block:
            raise GGUFFormatError(f"tensor {name}: row of {shape[-1]} is not whole blocks")
        shape[-1] = shape[-1] // block * size
        nbytes = int(np.prod(shape))
        data = buffer[start + offset:start + offset + nbytes]
        if len(data) != nbytes:
            raise GGUFFormatError(f"tensor {name} runs past the end of the file")
        numpy_type = {"F32": np.float32, "F16": np.float16}.get(qtype.name)
        if numpy_type is not None:
            shape[-1] //= np.dtype(numpy_type).itemsize
            return TensorInfo(name, qtype, data.view(numpy_type).reshape(shape))
        return TensorInfo(name, qtype, data.reshape(shape))
