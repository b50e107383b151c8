"""A GGUF file's metadata → the ``config.json`` / ``generation_config.json`` of the same model.

Reads llama.cpp's keys (``{arch}.block_count``, ``{arch}.attention.head_count_kv``, …, see the
GGUF spec) for the Llama and Qwen3 families. What the engine cannot run — partial rotary
(``rope.dimension_count`` below the head size), RoPE scaling, sliding windows, experts — is
refused with an error naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.engine.model.family import Family, family_of_gguf
from loraplex.engine.model.gguf_index import GGUFIndex
from loraplex.engine.model.gguf_weights import architecture, field_value
from loraplex.errors import user_error

REFUSED_KEYS = ("expert_count", "attention.sliding_window", "attention.q_lora_rank")


class _Keys:
    """``{arch}.*`` metadata of one file, with errors naming the key."""

    def __init__(self, reader: GGUFIndex, path: str | Path) -> None:
        self.reader, self.path = reader, path
        self.arch = architecture(reader, path)
        found = family_of_gguf(self.arch)
        assert found is not None, self.arch  # `architecture` checked it
        self.family: Family = found

    def get(self, key: str, default: Any = None) -> Any:
        return field_value(self.reader, f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise self.error(key, "required GGUF metadata key is missing")
        return value

    def error(self, key: str, problem: str) -> Exception:
        return user_error(f"{self.arch}.{key}", f"{self.path}: {problem}")


def hf_config_dict(reader: GGUFIndex, path: str | Path) -> dict[str, Any]:
    """Keyword arguments of ``LlamaConfig`` / ``Qwen3Config`` for this file.

    Raises:
        UserError: unsupported architecture or feature (the message names the GGUF key).
    """
    keys = _Keys(reader, path)
    _refuse_unsupported(keys)
    hidden, heads = int(keys.need("embedding_length")), int(keys.need("attention.head_count"))
    tokens = field_value(reader, "tokenizer.ggml.tokens") or ()
    ids = {role: field_value(reader, f"tokenizer.ggml.{role}_token_id")
           for role in ("bos", "eos", "padding")}
    # llama.cpp's default where the key is optional (llama_model_loader / convert_hf_to_gguf)
    theta = keys.get("rope.freq_base") or keys.family.gguf_rope_theta or 10_000.0
    return {
        "architectures": [keys.family.hf_class],
        "vocab_size": int(keys.get("vocab_size") or len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": int(keys.need("feed_forward_length")),
        "num_hidden_layers": int(keys.need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(keys.get("attention.head_count_kv") or heads),
        "head_dim": _head_dim(keys, hidden // heads),
        "rms_norm_eps": float(keys.need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(keys.get("context_length") or 2048),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(theta)},
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["padding"],
    }


def _refuse_unsupported(keys: _Keys) -> None:
    for key in REFUSED_KEYS:
        if keys.get(key):
            raise keys.error(key, "is not supported by this engine")
    scaling = keys.get("rope.scaling.type")
    if scaling not in (None, "none"):
        raise keys.error("rope.scaling.type", f"{scaling!r} is not supported")


def _head_dim(keys: _Keys, default: int) -> int:
    head_dim = int(keys.get("attention.key_length") or default)
    if int(keys.get("attention.value_length") or head_dim) != head_dim:
        raise keys.error("attention.value_length", "must equal key_length")
    if int(keys.get("rope.dimension_count") or head_dim) != head_dim:
        raise keys.error("rope.dimension_count", "partial rotary embeddings are not supported")
    return head_dim


def hf_config(reader: GGUFIndex, path: str | Path) -> Any:
    """The transformers config object (its ``save_pretrained`` writes config.json)."""
    from transformers import LlamaConfig, Qwen3Config

    kwargs = hf_config_dict(reader, path)
    config_class = {"Qwen3ForCausalLM": Qwen3Config, "LlamaForCausalLM": LlamaConfig}
    config = config_class[kwargs["architectures"][0]](**kwargs)
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
