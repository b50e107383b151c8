"""Built-in random models (``tiny`` for tests, ``small`` for benchmarks), made without network.

`create_builtin_model` writes a Hugging Face model directory: ``config.json``,
``generation_config.json``, ``model.safetensors`` (seeded random weights, HF names) and the
locally trained tokenizer. Same (arch, size, seed) → byte-identical weights and tokenizer.
The directory appears atomically (written beside it, then renamed).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from loraplex.engine.builtin.tokenizer import (
    TOKENIZER_FAMILIES,
    build_tokenizer,
    save_tokenizer,
    token_id,
)
from loraplex.engine.model.checkpoint import save_weights
from loraplex.engine.model.family import FAMILIES, BuiltinShape, Family
from loraplex.engine.model.moe_spec import ExpertSpec
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.weights import random_weights
from loraplex.errors import user_error

#: The archs with built-in models (`Family.builtin`).
ARCHES = tuple(arch for arch, f in FAMILIES.items() if f.builtin is not None)


@dataclass(frozen=True)
class BuiltinSize:
    """Shape of a built-in model (per family where they differ)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    corpus_chars: int
    max_position_embeddings: int = 8192


SIZES = {
    # ≤ 1M parameters: unit and integration tests.
    "tiny": BuiltinSize(vocab_size=1024, hidden_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=32, corpus_chars=60_000),
    # ≈ 20M parameters, 4 layers, hidden 512, vocab 8k: benchmarks.
    "small": BuiltinSize(vocab_size=8192, hidden_size=512, num_layers=4, num_heads=8,
                         num_kv_heads=4, head_dim=64, corpus_chars=1_500_000),
}
#: Long-context twins (``builtin:tiny-long`` / ``small-long``): the same model (same weights and
#: tokenizer for the same seed) with Qwen3's own 40,960-position context and rope theta 1e6,
#: for training and sampling 32K-token sequences.
LONG_CONTEXT = 40960
SIZES |= {f"{name}-long": replace(size, max_position_embeddings=LONG_CONTEXT)
          for name, size in list(SIZES.items())}
#: The built-in Qwen3-MoE models: 8 experts, top-2, every layer sparse (as in Qwen3-30B-A3B).
#: ``tiny`` ≈ 0.95M parameters (0.51M active); ``small`` ≈ 37M (18M active) for benchmarks.
MOE_EXPERTS = {
    "tiny": ExpertSpec(num_experts=8, top_k=2, expert_intermediate_size=96, norm_topk_prob=True,
                       sparse_layers=(0, 1)),
    "small": ExpertSpec(num_experts=8, top_k=2, expert_intermediate_size=512,
                        norm_topk_prob=True, sparse_layers=(0, 1, 2, 3)),
}


def _shape(arch: str) -> tuple[Family, BuiltinShape]:
    fam = FAMILIES[arch]
    assert fam.builtin is not None, f"{arch} has no built-in models"
    return fam, fam.builtin


def _base_size(size: str) -> str:
    """``tiny`` of ``tiny-long``: the size whose numbers a long-context twin shares."""
    return size.removesuffix("-long")


def config_dict(arch: str, size: str, token_ids: Mapping[str, int | None] | None = None
                ) -> dict[str, Any]:
    """The ``config.json`` keys of a built-in (transformers 5 names; a multimodal family's
    text numbers under its `Family.text_config`, with a tiny vision tower), token ids from
    ``token_ids`` (``bos_token_id``, ``eos_token_id``, ``pad_token_id``)."""
    s, (fam, shape) = SIZES[size], _shape(arch)
    base = _base_size(size)
    rope: dict[str, Any] = {"rope_type": shape.rope_kind, "rope_theta": shape.rope_theta}
    if shape.rope_kind == "llama3":
        rope.update(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=2048)
    if shape.rope_kind == "yarn":  # gpt-oss's (4,096 positions stretched to the context)
        rope.update(factor=s.max_position_embeddings / 4096, beta_fast=32.0, beta_slow=1.0,
                    truncate=False, original_max_position_embeddings=4096)
    if shape.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = shape.partial_rotary_factor
    if shape.mrope:  # Qwen3-VL's 24:20:20 of 64 frequencies, scaled to the head
        half = int(s.head_dim * shape.partial_rotary_factor) // 2
        rows = cols = half * 20 // 64
        rope |= {"mrope_section": [half - rows - cols, rows, cols], "mrope_interleaved": True}
    text: dict[str, Any] = dict(
        vocab_size=s.vocab_size, hidden_size=s.hidden_size, num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim, intermediate_size=shape.intermediate_size[base],
        rms_norm_eps=shape.rms_norm_eps, max_position_embeddings=s.max_position_embeddings,
        tie_word_embeddings=shape.tied, rope_parameters=rope, **(token_ids or {}),
        **shape.extra_config)
    if shape.layer_types is not None:
        text["layer_types"] = list(shape.layer_types[base])
    text |= _expert_keys(fam, base)
    if fam.experts == "qwen3_5_moe":  # every layer sparse: no dense MLP width
        del text["intermediate_size"]
    if fam.text_config is None:
        return {"architectures": [fam.hf_class], "model_type": fam.model_types[0], **text}
    text["model_type"] = fam.model_types[0]
    vision_ids = {k: v for k, v in (token_ids or {}).items() if k in VISION_TOKEN_KEYS}
    return {"architectures": [fam.hf_class], "model_type": fam.model_types[-1],
            fam.text_config: text,
            "vision_config": tiny_vision(s.hidden_size, deepstack=shape.deepstack),
            "tie_word_embeddings": shape.tied,
            **{k: v for k, v in (token_ids or {}).items() if k not in VISION_TOKEN_KEYS},
            **vision_ids}


def _expert_keys(fam: Family, size: str) -> dict[str, Any]:
    """config.json keys of a built-in's experts, as its family's config class names them."""
    if fam.experts == "none":
        return {}
    e = MOE_EXPERTS[size]
    if fam.experts == "gpt_oss":  # its experts' width is intermediate_size (set already)
        return dict(num_local_experts=e.num_experts, num_experts_per_tok=e.top_k)
    keys: dict[str, Any] = dict(num_experts=e.num_experts, num_experts_per_tok=e.top_k,
                                moe_intermediate_size=e.expert_intermediate_size)
    if fam.experts == "qwen3_5_moe":  # always renormalised, every layer sparse
        return keys | {"shared_expert_intermediate_size": e.expert_intermediate_size}
    return keys | dict(norm_topk_prob=e.norm_topk_prob, decoder_sparse_step=1,
                       mlp_only_layers=[])


#: config.json keys of the image marker tokens, and the tokens they name.
VISION_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                 "vision_start_token_id": "<|vision_start|>",
                 "vision_end_token_id": "<|vision_end|>"}
VISION_TOKEN_KEYS = tuple(VISION_TOKENS)
#: The built-ins' image processor bounds (``preprocessor_config.json``): 8-pixel patches merged
#: 2×2, so 16×16 pixels per token, from 4 to 64 tokens per image.
BUILTIN_MIN_PIXELS = 32 * 32
BUILTIN_MAX_PIXELS = 128 * 128


def tiny_vision(out_hidden_size: int, deepstack: bool = False) -> dict[str, Any]:
    """A vision tower small enough for tests: 2 blocks of width 32 over 8-pixel patches
    (DeepStack after the first, where the family has it)."""
    return {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": out_hidden_size, "num_position_embeddings": 64,
            **({"deepstack_visual_indexes": [0]} if deepstack else {})}


def preprocessor_config(vision: Mapping[str, Any]) -> dict[str, Any]:
    """The image processor a built-in ships (transformers' ``Qwen2VLImageProcessor``
    keys), so clients compute the same token counts as the server."""
    return {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "do_convert_rgb": True, "patch_size": vision["patch_size"],
            "temporal_patch_size": vision["temporal_patch_size"],
            "merge_size": vision["spatial_merge_size"],
            "size": {"shortest_edge": BUILTIN_MIN_PIXELS, "longest_edge": BUILTIN_MAX_PIXELS}}


def builtin_spec(arch: str, size: str) -> ModelSpec:
    """The spec a built-in model will have (eos ids aside), without creating it."""
    return ModelSpec.from_config(config_dict(arch, size))


def hf_config(arch: str, size: str, tokenizer: Any) -> Any:
    """The transformers config object of a built-in (its ``save_pretrained`` writes
    config.json): `config_dict`, token ids from the tokenizer."""
    from transformers import AutoConfig

    fam = TOKENIZER_FAMILIES[_shape(arch)[0].tokenizer]
    ids = {"bos_token_id": token_id(tokenizer, fam.bos or fam.special[0]),
           "eos_token_id": token_id(tokenizer, fam.eos),
           "pad_token_id": token_id(tokenizer, fam.pad) if fam.pad else None}
    if _shape(arch)[0].text_config is not None:
        ids |= {key: token_id(tokenizer, token) for key, token in VISION_TOKENS.items()
                if token in fam.special}
    values = config_dict(arch, size, ids)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    config.architectures = values["architectures"]
    return config


def vision_tensors(config: Any, seed: int) -> dict[str, torch.Tensor]:
    """A multimodal built-in's vision tower, seeded (``model.visual.*``): transformers' own
    init of its vision model class."""
    from transformers import AutoModel

    if getattr(config, "vision_config", None) is None:
        return {}
    torch.manual_seed(seed)
    tower = AutoModel.from_config(config.vision_config)
    return {f"model.visual.{k}": v for k, v in tower.state_dict().items()}


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
        tokenizer_family = _shape(arch)[0].tokenizer
        tokenizer = build_tokenizer(tokenizer_family, SIZES[size].vocab_size, seed,
                                    SIZES[size].corpus_chars)
        save_tokenizer(tokenizer, staging)
        config = hf_config(arch, size, tokenizer)
        config.save_pretrained(str(staging))
        GenerationConfig(
            bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id,
            eos_token_id=[token_id(tokenizer, t)
                          for t in TOKENIZER_FAMILIES[tokenizer_family].generation_eos],
        ).save_pretrained(str(staging))
        spec = ModelSpec.from_dir(staging)
        save_weights(staging, spec, random_weights(spec, seed),
                     extra=vision_tensors(config, seed))
        if spec.vision is not None:
            (staging / "preprocessor_config.json").write_text(json.dumps(
                preprocessor_config(config.vision_config.to_dict()), indent=2))
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

