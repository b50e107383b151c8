"""Built-in random models (``tiny`` for tests, ``small`` for benchmarks), made without network.

`create_builtin_model` writes a Hugging Face model directory: ``config.json``,
``generation_config.json``, ``model.safetensors`` (seeded random weights, HF names) and the
locally trained tokenizer. Same (arch, size, seed) → byte-identical weights and tokenizer.
The directory appears atomically (written beside it, then renamed).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loraplex.engine.builtin.tokenizer import (
    FAMILIES,
    build_tokenizer,
    save_tokenizer,
    token_id,
)
from loraplex.engine.model.checkpoint import save_weights
from loraplex.engine.model.moe_spec import ExpertSpec
from loraplex.engine.model.spec import ARCH_OF_MODEL_TYPE, CLASS_OF_ARCH, ModelSpec, RopeSpec
from loraplex.engine.model.weights import random_weights
from loraplex.errors import user_error

ARCHES = ("qwen3", "llama", "qwen3_moe")
#: The tokenizer family of each arch (Qwen3-MoE models use the Qwen3 tokenizer).
TOKENIZER_FAMILY = {"qwen3": "qwen3", "llama": "llama", "qwen3_moe": "qwen3"}


@dataclass(frozen=True)
class BuiltinSize:
    """Shape of a built-in model (per family where they differ)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: dict[str, int]
    corpus_chars: int
    max_position_embeddings: int = 8192


SIZES = {
    # ≤ 1M parameters: unit and integration tests.
    "tiny": BuiltinSize(vocab_size=1024, hidden_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=32,
                        intermediate_size={"qwen3": 384, "llama": 384, "qwen3_moe": 384},
                        corpus_chars=60_000),
    # ≈ 20M parameters, 4 layers, hidden 512, vocab 8k: benchmarks.
    "small": BuiltinSize(vocab_size=8192, hidden_size=512, num_layers=4, num_heads=8,
                         num_kv_heads=4, head_dim=64,
                         intermediate_size={"qwen3": 2048, "llama": 1536, "qwen3_moe": 2048},
                         corpus_chars=1_500_000),
}
#: Long-context twins (``builtin:tiny-long`` / ``small-long``): the same model (same weights and
#: tokenizer for the same seed) with Qwen3's own 40,960-position context and rope theta 1e6,
#: for training and sampling 32K-token sequences.
LONG_CONTEXT = 40960
SIZES |= {f"{name}-long": replace(size, max_position_embeddings=LONG_CONTEXT)
          for name, size in list(SIZES.items())}
#: Qwen3 ≤ 4B ties its embeddings; Llama 3.1 8B does not: the two built-ins cover both
#: (Qwen3-30B-A3B does not either).
TIED = {"qwen3": True, "llama": False, "qwen3_moe": False}
#: The built-in Qwen3-MoE models: 8 experts, top-2, every layer sparse (as in Qwen3-30B-A3B).
#: ``tiny`` ≈ 0.95M parameters (0.51M active); ``small`` ≈ 37M (18M active) for benchmarks.
MOE_EXPERTS = {
    "tiny": ExpertSpec(num_experts=8, top_k=2, expert_intermediate_size=96, norm_topk_prob=True,
                       sparse_layers=(0, 1)),
    "small": ExpertSpec(num_experts=8, top_k=2, expert_intermediate_size=512,
                        norm_topk_prob=True, sparse_layers=(0, 1, 2, 3)),
}


def builtin_spec(arch: str, size: str) -> ModelSpec:
    """The spec a built-in model will have (eos ids aside), without creating it."""
    s = SIZES[size]
    qwen = arch != "llama"
    rope = (RopeSpec(1e6) if qwen else
            RopeSpec(5e5, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position=2048))
    return ModelSpec(arch=ARCH_OF_MODEL_TYPE[arch], vocab_size=s.vocab_size,
                     hidden_size=s.hidden_size, intermediate_size=s.intermediate_size[arch],
                     num_layers=s.num_layers, num_heads=s.num_heads,
                     num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                     rms_norm_eps=1e-6 if qwen else 1e-5, rope=rope,
                     tie_word_embeddings=TIED[arch],
                     max_position_embeddings=s.max_position_embeddings,
                     experts=MOE_EXPERTS[size] if arch == "qwen3_moe" else None)


def hf_config(arch: str, size: str, tokenizer: Any) -> Any:
    """The transformers config object of a built-in (its ``save_pretrained`` writes
    config.json), numbers from `builtin_spec`, token ids from the tokenizer."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    spec = builtin_spec(arch, size)
    fam = FAMILIES[TOKENIZER_FAMILY[arch]]
    rope: dict[str, Any] = {"rope_type": spec.rope.kind, "rope_theta": spec.rope.theta}
    if spec.rope.kind == "llama3":
        rope.update(factor=spec.rope.factor, low_freq_factor=spec.rope.low_freq_factor,
                    high_freq_factor=spec.rope.high_freq_factor,
                    original_max_position_embeddings=spec.rope.original_max_position)
    kwargs: dict[str, Any] = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size, rms_norm_eps=spec.rms_norm_eps,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings, rope_parameters=rope,
        bos_token_id=token_id(tokenizer, fam.bos or fam.special[0]),
        eos_token_id=token_id(tokenizer, fam.eos),
        pad_token_id=token_id(tokenizer, fam.pad) if fam.pad else None,
    )
    if spec.experts is not None:
        e = spec.experts
        config: Any = Qwen3MoeConfig(
            **kwargs, num_experts=e.num_experts, num_experts_per_tok=e.top_k,
            moe_intermediate_size=e.expert_intermediate_size, norm_topk_prob=e.norm_topk_prob,
            decoder_sparse_step=1, mlp_only_layers=[])
    else:
        config = Qwen3Config(**kwargs) if arch == "qwen3" else LlamaConfig(**kwargs)
    config.architectures = [CLASS_OF_ARCH[spec.arch]]
    return config


def create_builtin_model(directory: str | Path, arch: str = "qwen3", size: str = "tiny",
                         seed: int = 0) -> Path:
    """Write a random built-in model + tokenizer to ``directory`` (which must not exist or be
    empty). Returns the directory.

    Raises:
        UserError: unknown arch/size, or a non-empty target directory.
    """
    from transformers import GenerationConfig

    if arch not in ARCHES:
        raise user_error("arch", f"unknown {arch!r}; known: {list(ARCHES)}")
    if size not in SIZES:
        raise user_error("size", f"unknown {size!r}; known: {list(SIZES)}")
    target = Path(directory)
    if target.exists() and any(target.iterdir()):
        raise user_error("directory", f"{target} exists and is not empty")
    staging = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        tokenizer = build_tokenizer(TOKENIZER_FAMILY[arch], SIZES[size].vocab_size, seed,
                                    SIZES[size].corpus_chars)
        save_tokenizer(tokenizer, staging)
        config = hf_config(arch, size, tokenizer)
        config.save_pretrained(str(staging))
        GenerationConfig(
            bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id,
            eos_token_id=[token_id(tokenizer, t)
                          for t in FAMILIES[TOKENIZER_FAMILY[arch]].generation_eos],
        ).save_pretrained(str(staging))
        spec = ModelSpec.from_dir(staging)
        save_weights(staging, spec, random_weights(spec, seed))
        if target.exists():
            target.rmdir()
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def ensure_builtin_model(directory: str | Path, arch: str = "qwen3", size: str = "tiny",
                         seed: int = 0) -> Path:
    """The model at ``directory``, created first when absent (the server's ``builtin:`` use)."""
    target = Path(directory)
    if (target / "config.json").is_file():
        return target
    return create_builtin_model(target, arch, size, seed)

