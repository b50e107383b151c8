"""The weights our engine runs, as a GGUF file llama.cpp loads: every tensor of a quantised
GGUF dequantised with the ``gguf`` package (the very call `loraplex.engine.model.gguf_weights`
makes to load it) and written back unquantised, F32, or F16/BF16 for the 2-D weights (norms
stay F32, as llama.cpp's own converter writes them). Every metadata key is copied as it is
(tokenizer, chat template, hyper-parameters) except ``general.file_type``, which names the new
type (added where the source has none). Tensors keep llama.cpp's layout (its permuted q/k
rows): llama.cpp reads them as it reads the original.

An F32 file therefore holds bit for bit the fp32 weights our engine loads (`import_gguf` and
the GGUF loader dequantise the same blocks with the same function); F16/BF16 hold them rounded
to nearest even, as ``tensor.to(torch.bfloat16)`` rounds them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

#: ``--gguf-type`` → (GGML tensor type name of the 2-D weights, ``general.file_type``).
GGUF_TYPES = {"f32": ("F32", 0), "f16": ("F16", 1), "bf16": ("BF16", 32)}


def exported_path(source: Path, folder: Path, gguf_type: str) -> Path:
    """Where `export_gguf` writes ``source`` as ``gguf_type``: ``<stem minus its quant>.<TYPE>``
    (``SmolLM2-135M-Instruct.Q4_1.gguf`` → ``SmolLM2-135M-Instruct.F32.gguf``)."""
    stem = source.name.removesuffix(".gguf").rsplit(".", 1)[0]
    return folder / f"{stem}.{GGUF_TYPES[gguf_type][0]}.gguf"


def ensure_exported(source: Path, folder: Path, gguf_type: str) -> Path:
    """`export_gguf` of ``source`` unless its output exists and is newer than the source."""
    target = exported_path(source, folder, gguf_type)
    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    return export_gguf(source, target, gguf_type)


def export_gguf(source: Path, target: Path, gguf_type: str) -> Path:
    """Write ``source``'s tensors dequantised to ``gguf_type`` (see the module docstring) and
    its metadata to ``target`` (written beside it, then renamed into place); returns
    ``target``."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys

    reader = GGUFReader(source)
    tensor_type, file_type = GGUF_TYPES[gguf_type]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    arch = reader.fields[Keys.General.ARCHITECTURE].contents()
    writer = GGUFWriter(staging, arch)
    try:
        for field in reader.fields.values():
            if (field.name in (Keys.General.ARCHITECTURE, Keys.General.FILE_TYPE)
                    or field.name.startswith("GGUF.")):
                continue  # the writer's own, and the new type
            kind = field.types[0]
            sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
        writer.add_file_type(file_type)
        for tensor in reader.tensors:
            add_tensor(writer, tensor.name, dequantized(tensor), tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        staging.rename(target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def dequantized(tensor: Any) -> np.ndarray:
    """A reader tensor's values as fp32, in GGUF's own (numpy row-major) layout."""
    from gguf.quants import dequantize

    values = dequantize(tensor.data, tensor.tensor_type)
    return np.ascontiguousarray(values, dtype=np.float32)


def add_tensor(writer: Any, name: str, values: np.ndarray, tensor_type: str) -> None:
    """Add ``values`` (fp32) as ``tensor_type`` when 2-D, as F32 when 1-D (norms)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if values.ndim == 1 or tensor_type == "F32":
        writer.add_tensor(name, values)
    elif tensor_type == "F16":
        writer.add_tensor(name, values.astype(np.float16))
    else:
        kind = GGMLQuantizationType[tensor_type]
        writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)
