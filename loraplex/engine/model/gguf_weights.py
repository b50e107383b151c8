"""Base-model weights read straight from a GGUF file (llama.cpp's format), dequantised with the
ggml project's own ``gguf`` package.

GGUF names tensors ``token_embd``, ``blk.N.attn_q``, … and llama.cpp's converter permutes the
rows of Llama's ``attn_q``/``attn_k`` (its RoPE pairs dimensions ``(2i, 2i+1)``, the HF layout
pairs ``(i, i + d/2)``): `read_hf_state` undoes that permutation and returns HF-named tensors,
so the rest of the engine sees the same `BaseWeights` a safetensors checkpoint gives. Qwen3
GGUFs are written unpermuted. A GGUF-backed model directory (see `loraplex.engine.gguf`) holds
config and tokenizer files plus ``gguf_source.json`` naming the file; `gguf_file_of` finds it.

Every quantisation type the ``gguf`` package dequantises and this engine accepts is listed in
`SUPPORTED_TYPES`; anything else (IQ*, TQ*, MXFP4, …) is refused before any tensor is read,
with an error naming the tensor and its type.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loraplex.engine.model.family import FAMILIES
from loraplex.engine.model.gguf_index import GGUFIndex
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.weights import BaseWeights, expected_names, from_hf_state
from loraplex.errors import user_error

POINTER_FILE = "gguf_source.json"
#: llama.cpp architectures with a family record (`Family.gguf_arch`).
SUPPORTED_ARCHS = tuple(f.gguf_arch for f in FAMILIES.values() if f.gguf_arch is not None)
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
#: Tensors some GGUFs carry that this engine cannot honour, with the reason.
REFUSED_TENSORS = {"rope_freqs.weight": "per-frequency RoPE factors (Llama 3.1 scaling stored "
                                        "as a tensor) are not supported"}


def open_reader(path: str | Path) -> GGUFIndex:
    """The metadata and tensor table of ``path`` (memory-mapped, nothing dequantised yet).

    Raises:
        UserError: no such file, or not a GGUF file.
    """
    if not os.path.isfile(path):
        raise user_error("model", f"{path}: no such GGUF file")
    try:
        return GGUFIndex(path)
    except (ValueError, OSError) as err:
        raise user_error("model", f"{path} is not a readable GGUF file: {err}") from err


def field_value(reader: GGUFIndex, key: str, default: Any = None) -> Any:
    """A metadata value (string arrays as their length only, see `GGUFIndex`), or ``default``."""
    return reader.fields.get(key, default)


def architecture(reader: GGUFIndex, path: str | Path) -> str:
    """``general.architecture``, checked against `SUPPORTED_ARCHS`.

    Raises:
        UserError: naming ``general.architecture`` and its value when unsupported.
    """
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise user_error("general.architecture",
                         f"{path}: GGUF architecture {arch!r} is not supported; supported: "
                         f"{list(SUPPORTED_ARCHS)}")
    return str(arch)


def check_tensors(reader: GGUFIndex, path: str | Path) -> None:
    """Refuse unsupported quantisation types and tensors this engine has no use for, naming
    the first offending tensor, before anything is dequantised."""
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise user_error("model", f"{path}: tensor {tensor.name} has GGML type {kind}, "
                                      f"which is not supported; supported: {list(SUPPORTED_TYPES)}")
        if tensor.name in REFUSED_TENSORS:
            raise user_error("model", f"{path}: tensor {tensor.name}: "
                                      f"{REFUSED_TENSORS[tensor.name]}")
        hf_name(tensor.name, path)


def hf_name(name: str, path: str | Path) -> str:
    """The HF parameter name of a GGUF tensor name."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    match = _LAYER_TENSOR.fullmatch(name)
    if match is None or match.group(2) not in LAYER_NAMES:
        raise user_error("model", f"{path}: tensor {name} is not one a llama/qwen3 model has "
                                  "(biases, MoE experts and extra heads are not supported)")
    return f"model.layers.{match.group(1)}.{LAYER_NAMES[match.group(2)]}.weight"


def unpermute_rows(weight_R_C: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of Llama q/k rows (interleaved → half-split RoPE pairs)."""
    rows = weight_R_C.shape[0]
    per_head = weight_R_C.reshape(num_heads, rows // num_heads // 2, 2, *weight_R_C.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight_R_C.shape)


def read_hf_state(path: str | Path, spec: ModelSpec, device: torch.device,
                  dtype: torch.dtype, keep: Collection[str] | None = None
                  ) -> dict[str, torch.Tensor]:
    """Every tensor of the file (``keep``: those HF names only), dequantised to fp32 one at a
    time, HF-named and HF-laid-out, then moved to ``device``/``dtype``."""
    from gguf.quants import dequantize

    reader = open_reader(path)
    architecture(reader, path)
    check_tensors(reader, path)
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name, path)
        if keep is not None and name not in keep:
            continue
        values = dequantize(tensor.data, tensor.tensor_type)
        if spec.family.gguf_permutes_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = spec.num_heads if name.endswith("q_proj.weight") else spec.num_kv_heads
            values = unpermute_rows(values, heads)
        tensors[name] = torch.from_numpy(np.array(values, dtype=np.float32, order="C")).to(
            device=device, dtype=dtype)
    return tensors


def load_gguf_weights(path: str | Path, spec: ModelSpec, device: torch.device,
                      dtype: torch.dtype) -> BaseWeights:
    """`BaseWeights` from a GGUF file; missing, unexpected or misshapen tensors are errors.

    Raises:
        UserError: unsupported architecture / tensor types, or tensors not matching the spec.
    """
    wanted = expected_names(spec)  # a stage's: its share, the rest is not dequantised
    known = expected_names(spec.whole_spec)
    tensors = read_hf_state(path, spec, device, dtype, keep=wanted)
    names = {hf_name(t.name, path) for t in open_reader(path).tensors}
    if spec.tie_word_embeddings:
        names.discard("lm_head.weight")
    missing, unexpected = sorted(known - names), sorted(names - known)
    if missing or unexpected:
        raise user_error("model", f"{path}: tensors do not match its metadata "
                                  f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    for name, tensor in tensors.items():
        shape = expected_shape(spec, name)
        if tuple(tensor.shape) != shape:
            raise user_error("model", f"{path}: {name} has shape {tuple(tensor.shape)}, "
                                      f"the metadata implies {shape}")
    return from_hf_state(spec, tensors)


def expected_shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    """The HF ``(out, in)`` shape of a parameter of this spec."""
    d, ff = spec.hidden_size, spec.intermediate_size
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (spec.vocab_size, d)
    suffix = name.split(".", 3)[-1].removesuffix(".weight")
    shapes = {
        "self_attn.q_proj": (spec.q_size, d), "self_attn.k_proj": (spec.kv_size, d),
        "self_attn.v_proj": (spec.kv_size, d), "self_attn.o_proj": (d, spec.q_size),
        "mlp.gate_proj": (ff, d), "mlp.up_proj": (ff, d), "mlp.down_proj": (d, ff),
        "self_attn.q_norm": (spec.head_dim,), "self_attn.k_norm": (spec.head_dim,),
    }
    return shapes.get(suffix, (d,))


def gguf_file_of(model_dir: str | Path) -> Path | None:
    """The GGUF file a GGUF-backed model directory reads its weights from (None: a plain HF
    directory).

    Raises:
        UserError: the recorded file is gone or has changed since the directory was made.
    """
    pointer = Path(model_dir) / POINTER_FILE
    if not pointer.is_file():
        return None
    record = json.loads(pointer.read_text())
    path = Path(record["gguf_file"])
    if not path.is_file() or path.stat().st_size != record["size"]:
        raise user_error("model", f"{model_dir}: its GGUF file {path} is missing or changed "
                                  "since the directory was made; serve the gguf: source again")
    return path
