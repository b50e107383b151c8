"""`VisionWeights`: the frozen tensors of a vision tower (`vision_spec`), with their Hugging Face
names (``model.visual.…``, as ``Qwen3VLForConditionalGeneration`` and
``Qwen3_5ForConditionalGeneration`` save them).

The patch embedding's Conv3d has kernel = stride, so it is a linear map of each flattened patch:
held as ``patch_D_F`` (the kernel flattened in the order the pixels are flattened).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from loraplex.engine.model.vision_spec import VisionSpec
from loraplex.errors import user_error

PREFIX = "model.visual."


@dataclass
class VisionBlockWeights:
    """One attention block: pre-norms, fused q/k/v, output projection, MLP (all with biases)."""

    norm1_w: torch.Tensor
    norm1_b: torch.Tensor
    norm2_w: torch.Tensor
    norm2_b: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor
    proj_w: torch.Tensor
    proj_b: torch.Tensor
    fc1_w: torch.Tensor
    fc1_b: torch.Tensor
    fc2_w: torch.Tensor
    fc2_b: torch.Tensor


_BLOCK_NAMES = {"norm1_w": "norm1.weight", "norm1_b": "norm1.bias", "norm2_w": "norm2.weight",
                "norm2_b": "norm2.bias", "qkv_w": "attn.qkv.weight", "qkv_b": "attn.qkv.bias",
                "proj_w": "attn.proj.weight", "proj_b": "attn.proj.bias",
                "fc1_w": "mlp.linear_fc1.weight", "fc1_b": "mlp.linear_fc1.bias",
                "fc2_w": "mlp.linear_fc2.weight", "fc2_b": "mlp.linear_fc2.bias"}


@dataclass
class MergerWeights:
    """A patch merger: LayerNorm (over one patch, or over the merged group: post-shuffle),
    then two linears with a GELU between."""

    norm_w: torch.Tensor
    norm_b: torch.Tensor
    fc1_w: torch.Tensor
    fc1_b: torch.Tensor
    fc2_w: torch.Tensor
    fc2_b: torch.Tensor


_MERGER_NAMES = {"norm_w": "norm.weight", "norm_b": "norm.bias",
                 "fc1_w": "linear_fc1.weight", "fc1_b": "linear_fc1.bias",
                 "fc2_w": "linear_fc2.weight", "fc2_b": "linear_fc2.bias"}


@dataclass
class VisionWeights:
    """The whole tower."""

    patch_D_F: torch.Tensor
    patch_b: torch.Tensor
    pos_embed_N_D: torch.Tensor
    blocks: list[VisionBlockWeights]
    merger: MergerWeights
    deepstack: list[MergerWeights]


def expected_vision_names(spec: VisionSpec) -> set[str]:
    return {name for name, _ in _shapes(spec)}


def vision_from_hf(spec: VisionSpec, tensors: Mapping[str, torch.Tensor]) -> VisionWeights:
    """The tower from HF-named tensors; a missing name or a wrong shape names itself."""
    for name, shape in _shapes(spec):
        if name not in tensors:
            raise user_error("model", f"vision tower: missing {name}")
        if tuple(tensors[name].shape) != shape:
            raise user_error("model", f"{name} has shape {tuple(tensors[name].shape)}, "
                             f"config.json implies {shape}")

    def merger(prefix: str) -> MergerWeights:
        return MergerWeights(**{f: tensors[f"{prefix}{n}"] for f, n in _MERGER_NAMES.items()})

    return VisionWeights(
        patch_D_F=tensors[f"{PREFIX}patch_embed.proj.weight"].reshape(spec.hidden_size, -1),
        patch_b=tensors[f"{PREFIX}patch_embed.proj.bias"],
        pos_embed_N_D=tensors[f"{PREFIX}pos_embed.weight"],
        blocks=[VisionBlockWeights(**{f: tensors[f"{PREFIX}blocks.{i}.{n}"]
                                      for f, n in _BLOCK_NAMES.items()})
                for i in range(spec.depth)],
        merger=merger(f"{PREFIX}merger."),
        deepstack=[merger(f"{PREFIX}deepstack_merger_list.{i}.")
                   for i in range(len(spec.deepstack_indexes))])


def _shapes(spec: VisionSpec) -> list[tuple[str, tuple[int, ...]]]:
    d, f, m = spec.hidden_size, spec.intermediate_size, spec.spatial_merge_size ** 2
    t, p, c = spec.temporal_patch_size, spec.patch_size, spec.in_channels
    shapes: list[tuple[str, tuple[int, ...]]] = [
        (f"{PREFIX}patch_embed.proj.weight", (d, c, t, p, p)),
        (f"{PREFIX}patch_embed.proj.bias", (d,)),
        (f"{PREFIX}pos_embed.weight", (spec.num_position_embeddings, d))]
    block = {"norm1_w": (d,), "norm1_b": (d,), "norm2_w": (d,), "norm2_b": (d,),
             "qkv_w": (3 * d, d), "qkv_b": (3 * d,), "proj_w": (d, d), "proj_b": (d,),
             "fc1_w": (f, d), "fc1_b": (f,), "fc2_w": (d, f), "fc2_b": (d,)}
    for i in range(spec.depth):
        shapes += [(f"{PREFIX}blocks.{i}.{_BLOCK_NAMES[k]}", s) for k, s in block.items()]

    def merger(prefix: str, norm: int) -> list[tuple[str, tuple[int, ...]]]:
        wide = d * m
        sizes = {"norm_w": (norm,), "norm_b": (norm,), "fc1_w": (wide, wide),
                 "fc1_b": (wide,), "fc2_w": (spec.out_hidden_size, wide),
                 "fc2_b": (spec.out_hidden_size,)}
        return [(f"{prefix}{_MERGER_NAMES[k]}", s) for k, s in sizes.items()]

    shapes += merger(f"{PREFIX}merger.", d)
    for i in range(len(spec.deepstack_indexes)):
        shapes += merger(f"{PREFIX}deepstack_merger_list.{i}.", d * m)
    return shapes

