"""What the rest of the system may know about a loaded base model (no tensors)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """Facts about one loaded base model, for validation, metering and FLOP accounting.

    Attributes:
        arch: ``qwen3`` or ``llama``.
        vocab_size: valid token ids are ``0 ≤ id < vocab_size``.
        max_context: longest prompt + completion (and longest training datum) accepted.
        eos_token_ids: tokens that end a completion under the default stop condition.
        num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size:
            architecture numbers.
        num_params: total parameters, embeddings included.
        num_non_embedding_params: parameters touched by the matmuls of one token
            (transformer blocks + output head), the N in "2·N FLOPs per token".
    """

    arch: str
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_params: int
    num_non_embedding_params: int
