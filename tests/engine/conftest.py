"""Engine test fixtures: random tiny HF reference models saved to disk, and our spec twins."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

HfFactory = Callable[..., tuple[Path, Any]]


#: The tiny Qwen3-MoE: 8 experts of width 32, top-2 (overridable like every other field).
MOE_DEFAULTS: dict[str, Any] = dict(num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=32, norm_topk_prob=True)


def hf_config(arch: str, tie: bool, **overrides: Any) -> Any:
    """A tiny transformers config: GQA (4 heads, 2 kv heads), llama3 rope scaling for llama."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    kw: dict[str, Any] = dict(vocab_size=320, hidden_size=64, intermediate_size=96,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, tie_word_embeddings=tie, max_position_embeddings=1024)
    if arch == "qwen3_moe":
        kw.update(MOE_DEFAULTS)
    kw.update(overrides)
    if arch == "qwen3":
        return Qwen3Config(**kw, rope_theta=1e6)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64, rope_theta=5e5)
    return LlamaConfig(**kw, rope_parameters=rope)


def build_hf_model(config: Any, seed: int = 0, std: float = 0.2) -> Any:
    """A randomly initialised HF causal LM with weights large enough to make attention sharp."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, std)
    return model.eval()


@pytest.fixture(scope="session")
def hf_model_factory(tmp_path_factory: pytest.TempPathFactory) -> HfFactory:
    """``make(arch, tie, **overrides) -> (dir, hf_model)``, cached per argument set."""
    cache: dict[tuple[Any, ...], tuple[Path, Any]] = {}

    def make(arch: str, tie: bool, **overrides: Any) -> tuple[Path, Any]:
        key = (arch, tie, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in cache:
            model = build_hf_model(hf_config(arch, tie, **overrides))
            path = tmp_path_factory.mktemp(f"hf-{arch}-{'tied' if tie else 'untied'}")
            model.save_pretrained(path)
            cache[key] = (path, model)
        return cache[key]

    return make
