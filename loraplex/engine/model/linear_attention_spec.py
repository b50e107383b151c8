"""`LinearAttentionSpec`: the gated-DeltaNet numbers of a hybrid model (Qwen3.5), and its layer
types, parsed from ``config.json``.

``layer_types`` lists each layer's token mixer (``linear_attention`` or ``full_attention``);
configs without it get transformers' default, every ``full_attention_interval``-th layer (4)
full. The linear layers' keys ``linear_num_key_heads`` × ``linear_key_head_dim``, values
``linear_num_value_heads`` × ``linear_value_head_dim`` (each key head serves
``value heads / key heads`` consecutive value heads), and a depthwise causal convolution of
``linear_conv_kernel_dim`` taps over the concatenated q, k, v. Knows no tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.engine.model.family import LayerType
from loraplex.errors import user_error

LAYER_TYPES: tuple[LayerType, ...] = ("full_attention", "linear_attention", "sliding_attention")


@dataclass(frozen=True)
class LinearAttentionSpec:
    """The linear-attention layers' shape.

    Attributes:
        num_k_heads, k_head_dim: query/key heads and their width.
        num_v_heads, v_head_dim: value heads and their width (a multiple of the key heads).
        conv_kernel: taps of the causal convolution.
    """

    num_k_heads: int
    k_head_dim: int
    num_v_heads: int
    v_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v concatenated."""
        return 2 * self.key_dim + self.value_dim

    def projection_sizes(self) -> tuple[int, int, int, int, int, int]:
        """Output rows of the layer's input projections in the order the engine stacks them:
        q, k, v (``in_proj_qkv``), z, b, a."""
        return (self.key_dim, self.key_dim, self.value_dim, self.value_dim, self.num_v_heads,
                self.num_v_heads)

    def layer_params(self, hidden_size: int) -> int:
        """Weights of one linear-attention layer (projections, convolution, decay, norm)."""
        d = hidden_size
        return (d * sum(self.projection_sizes()) + self.conv_dim * self.conv_kernel
                + 2 * self.num_v_heads + self.v_head_dim + self.value_dim * d)


def parse_layer_types(config: Mapping[str, Any], num_layers: int,
                      allowed: tuple[LayerType, ...]) -> tuple[LayerType, ...]:
    """Each layer's token mixer; ``()`` when every layer is full attention (the common case).

    Raises:
        UserError: a type the family does not have, or a list of the wrong length.
    """
    types = config.get("layer_types")
    if types is None and "linear_attention" in allowed:
        interval = int(config.get("full_attention_interval") or 4)
        types = ["linear_attention" if (i + 1) % interval else "full_attention"
                 for i in range(num_layers)]
    if types is None:
        return ()
    if len(types) != num_layers:
        raise user_error("config.layer_types",
                         f"has {len(types)} entries for {num_layers} layers")
    for t in types:
        if t not in allowed:
            raise user_error("config.layer_types", f"unsupported layer type {t!r} for this "
                                                   f"family; supported: {list(allowed)}")
    if all(t == "full_attention" for t in types):
        return ()
    return tuple(types)


def parse_linear_attention(config: Mapping[str, Any]) -> LinearAttentionSpec:
    """The linear layers' numbers (all keys required, named when missing or inconsistent)."""
    def need(key: str) -> int:
        value = config.get(key)
        if not isinstance(value, int) or value < 1:
            raise user_error(f"config.{key}", f"must be a positive integer, got {value!r}")
        return value

    spec = LinearAttentionSpec(num_k_heads=need("linear_num_key_heads"),
                               k_head_dim=need("linear_key_head_dim"),
                               num_v_heads=need("linear_num_value_heads"),
                               v_head_dim=need("linear_value_head_dim"),
                               conv_kernel=need("linear_conv_kernel_dim"))
    if spec.num_v_heads % spec.num_k_heads:
        raise user_error("config.linear_num_value_heads",
                         f"{spec.num_v_heads} is not a multiple of linear_num_key_heads "
                         f"{spec.num_k_heads}")
    return spec
