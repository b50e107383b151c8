"""`VisionSpec`: the vision tower of a multimodal checkpoint (Qwen3-VL, Qwen3.5), parsed from
``config.json``'s ``vision_config`` and the image token ids around it.

Qwen3-VL and Qwen3.5 share one tower (transformers' ``Qwen3VLVisionModel`` /
``Qwen3_5VisionModel``): a Conv3d patch embedding, a learned position grid resampled
bilinearly to each image, 2-D rotary attention blocks over all of an image's patches, and a
merger of 2×2 patches into one language-model token; Qwen3-VL also feeds DeepStack features
(mergers after chosen blocks) into the first decoder layers. Knows no tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.errors import user_error

#: The activations the tower's MLPs may name (transformers' ACT2FN keys we implement).
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


@dataclass(frozen=True)
class VisionSpec:
    """The tower's shape and the tokens that mark images in the text.

    Attributes:
        depth, hidden_size, intermediate_size, num_heads: the blocks.
        hidden_act: the blocks' MLP activation.
        in_channels, patch_size, temporal_patch_size: the patch embedding's Conv3d.
        spatial_merge_size: patches per side merged into one token.
        out_hidden_size: the merged tokens' width (the language model's hidden size).
        num_position_embeddings: the learned position grid (a square).
        deepstack_indexes: blocks after which a DeepStack merger feeds decoder layer k (k-th
            entry); empty: none (Qwen3.5).
        rope_theta: the tower's 2-D rotary base.
        image_token_id, vision_start_token_id, vision_end_token_id: the text's markers.
    """

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    hidden_act: str
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_indexes: tuple[int, ...]
    rope_theta: float
    image_token_id: int
    vision_start_token_id: int | None
    vision_end_token_id: int | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid_side(self) -> int:
        """Side of the learned position grid."""
        return int(self.num_position_embeddings ** 0.5)

    @property
    def patch_features(self) -> int:
        """Values per patch: channels × frames × pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


def vision_of(config: Mapping[str, Any]) -> VisionSpec | None:
    """The config's vision tower, or None for a text-only config (or one naming no image
    token); what the engine does not implement is refused naming the key."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        raise user_error("config.vision_config.hidden_act",
                         f"unsupported {act!r}; supported: {list(ACTIVATIONS)}")
    rope = vision.get("rope_parameters") or {}
    image_token = config.get("image_token_id")
    if not isinstance(image_token, int):  # nowhere to put images: served as text only
        return None
    spec = VisionSpec(
        depth=int(vision.get("depth", 27)), hidden_size=int(vision.get("hidden_size", 1152)),
        intermediate_size=int(vision.get("intermediate_size", 4304)),
        num_heads=int(vision.get("num_heads", 16)), hidden_act=act,
        in_channels=int(vision.get("in_channels", 3)),
        patch_size=_int(vision.get("patch_size", 16), "patch_size"),
        temporal_patch_size=_int(vision.get("temporal_patch_size", 2), "temporal_patch_size"),
        spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
        out_hidden_size=int(vision.get("out_hidden_size", 3584)),
        num_position_embeddings=int(vision.get("num_position_embeddings", 2304)),
        deepstack_indexes=tuple(int(i) for i in vision.get("deepstack_visual_indexes") or ()),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        image_token_id=image_token,
        vision_start_token_id=config.get("vision_start_token_id"),
        vision_end_token_id=config.get("vision_end_token_id"))
    if spec.hidden_size % spec.num_heads or spec.grid_side ** 2 != spec.num_position_embeddings:
        raise user_error("config.vision_config", "hidden_size must split into num_heads and "
                         "num_position_embeddings be a square")
    if any(not 0 <= i < spec.depth for i in spec.deepstack_indexes):
        raise user_error("config.vision_config.deepstack_visual_indexes",
                         f"must name blocks of the {spec.depth}")
    return spec


def _int(value: Any, key: str) -> int:
    if isinstance(value, (list, tuple)):  # [p, p]: square patches only
        if len(set(value)) != 1:
            raise user_error(f"config.vision_config.{key}", f"non-square {value} unsupported")
        value = value[0]
    return int(value)
