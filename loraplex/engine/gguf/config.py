"""A GGUF file's metadata → the ``config.json`` / ``generation_config.json`` of the same model.

Reads llama.cpp's keys (``{arch}.block_count``, ``{arch}.attention.head_count_kv``, …, see the
GGUF spec) for the Llama and Qwen3 families. What the engine cannot run — partial rotary
(``rope.dimension_count`` below the head size), RoPE scaling, sliding windows, experts — is
refused with an error naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.engine.model.gguf_index import GGUFIndex
from loraplex.engine.model.gguf_weights import architecture, field_value
from loraplex.engine.model.spec import ARCH_OF_MODEL_TYPE, CLASS_OF_ARCH
from loraplex.errors import user_error

#: llama.cpp's defaults where a key is optional (llama_model_loader / convert_hf_to_gguf).
DEFAULT_ROPE_THETA = {"llama": 10_000.0, "qwen3": 1_000_000.0}
REFUSED_KEYS = ("expert_count", "attention.sliding_window", "attention.q_lora_rank")


def hf_config_dict(reader: GGUFIndex, path: str | Path) -> dict[str, Any]:
    """Keyword arguments of ``LlamaConfig`` / ``Qwen3Config`` for this file.

    Raises:
        UserError: unsupported architecture or feature (the message names the GGUF key).
    """
    arch = architecture(reader, path)

    def get(key: str, default: Any = None) -> Any:
        return field_value(reader, f"{arch}.{key}", default)

    def need(key: str) -> Any:
        value = get(key)
        if value is None:
            raise user_error(f"{arch}.{key}", f"{path}: required GGUF metadata key is missing")
        return value

    for key in REFUSED_KEYS:
        if get(key):
            raise user_error(f"{arch}.{key}", f"{path}: is not supported by this engine")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv") or heads)
    head_dim = int(get("attention.key_length") or hidden // heads)
    if int(get("attention.value_length") or head_dim) != head_dim:
        raise user_error(f"{arch}.attention.value_length", f"{path}: must equal key_length")
    if int(get("rope.dimension_count") or head_dim) != head_dim:
        raise user_error(f"{arch}.rope.dimension_count",
                         f"{path}: partial rotary embeddings are not supported")
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        raise user_error(f"{arch}.rope.scaling.type", f"{path}: {scaling!r} is not supported")
    names = {tensor.name for tensor in reader.tensors}
    tokens = field_value(reader, "tokenizer.ggml.tokens") or ()
    ids = {role: field_value(reader, f"tokenizer.ggml.{role}_token_id")
           for role in ("bos", "eos", "padding")}
    return {
        "architectures": [CLASS_OF_ARCH[ARCH_OF_MODEL_TYPE[arch]]],
        "vocab_size": int(get("vocab_size") or len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(get("context_length") or 2048),
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": float(get("rope.freq_base") or DEFAULT_ROPE_THETA[arch])},
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["padding"],
    }


def hf_config(reader: GGUFIndex, path: str | Path) -> Any:
    """The transformers config object (its ``save_pretrained`` writes config.json)."""
    from transformers import LlamaConfig, Qwen3Config

    kwargs = hf_config_dict(reader, path)
    is_qwen3 = kwargs["architectures"] == [CLASS_OF_ARCH["qwen3"]]
    config = Qwen3Config(**kwargs) if is_qwen3 else LlamaConfig(**kwargs)
    config.architectures = kwargs["architectures"]
    return config


def generation_eos_ids(reader: GGUFIndex) -> list[int]:
    """End-of-generation tokens: ``eos`` then ``eot`` (chat models' end of turn), deduplicated."""
    ids: list[int] = []
    for role in ("eos", "eot", "eom"):
        value = field_value(reader, f"tokenizer.ggml.{role}_token_id")
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return ids
