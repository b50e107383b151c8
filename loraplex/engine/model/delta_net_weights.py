"""`DeltaNetWeights`: the frozen tensors of one gated-DeltaNet (linear attention) layer, and their
Hugging Face names (transformers' ``Qwen3_5GatedDeltaNet``)::

    linear_attn.in_proj_qkv.weight   (2·key_dim + value_dim, d)   q ‖ k ‖ v
    linear_attn.in_proj_z.weight     (value_dim, d)   the output gate
    linear_attn.in_proj_b.weight     (Hv, d)          β = sigmoid(b)
    linear_attn.in_proj_a.weight     (Hv, d)          the decay's input
    linear_attn.conv1d.weight        (conv_dim, 1, K) depthwise, no bias
    linear_attn.dt_bias              (Hv,)
    linear_attn.A_log                (Hv,)            g = −exp(A_log)·softplus(a + dt_bias)
    linear_attn.norm.weight          (Dv,)            gated RMSNorm (not zero-centred)
    linear_attn.out_proj.weight      (d, value_dim)

(each after ``model.layers.{i}.``).
Knows nothing about files (`checkpoint` reads them) or the computation (`linear_attention`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields

import torch

from loraplex.engine.model.linear_attention_spec import LinearAttentionSpec

#: Field → name suffix after ``model.layers.{i}.linear_attn.``.
HF_SUFFIX = {"in_proj_qkv": "in_proj_qkv.weight", "in_proj_z": "in_proj_z.weight",
             "in_proj_b": "in_proj_b.weight", "in_proj_a": "in_proj_a.weight",
             "conv_C_1_K": "conv1d.weight", "dt_bias_H": "dt_bias", "a_log_H": "A_log",
             "norm_D": "norm.weight", "out_proj": "out_proj.weight"}


@dataclass
class DeltaNetWeights:
    """One linear-attention layer's tensors (HF layouts, see the module docstring)."""

    in_proj_qkv: torch.Tensor
    in_proj_z: torch.Tensor
    in_proj_b: torch.Tensor
    in_proj_a: torch.Tensor
    conv_C_1_K: torch.Tensor
    dt_bias_H: torch.Tensor
    a_log_H: torch.Tensor
    norm_D: torch.Tensor
    out_proj: torch.Tensor

    def tensors(self) -> Iterator[torch.Tensor]:
        return (getattr(self, f.name) for f in fields(self))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> DeltaNetWeights:
        return DeltaNetWeights(*(fn(t) for t in self.tensors()))


def hf_names(layer: int) -> dict[str, str]:
    """Field → full HF name of layer ``layer``'s tensors."""
    return {f: f"model.layers.{layer}.linear_attn.{s}" for f, s in HF_SUFFIX.items()}


def from_hf(layer: int, tensors: Mapping[str, torch.Tensor]) -> DeltaNetWeights:
    """Layer ``layer``'s tensors (a KeyError names a missing one)."""
    return DeltaNetWeights(**{f: tensors[name] for f, name in hf_names(layer).items()})


def named_tensors(layer: int, weights: DeltaNetWeights) -> Iterator[tuple[str, torch.Tensor]]:
    for f, name in hf_names(layer).items():
        yield name, getattr(weights, f)


def random_delta_net(spec: LinearAttentionSpec, hidden: int,
                     normal: Callable[..., torch.Tensor], gen: torch.Generator
                     ) -> DeltaNetWeights:
    """Seeded random weights (transformers' init: decay rates ``A = exp(A_log)`` uniform in
    [1, 16], ``dt_bias`` 1, the norm 1; a wider convolution than the projections so that
    it visibly mixes positions)."""
    d, heads = hidden, spec.num_v_heads
    a_log = torch.empty(heads).uniform_(1, 16, generator=gen).log()
    return DeltaNetWeights(
        in_proj_qkv=normal(spec.conv_dim, d), in_proj_z=normal(spec.value_dim, d),
        in_proj_b=normal(heads, d), in_proj_a=normal(heads, d),
        conv_C_1_K=normal(spec.conv_dim, 1, spec.conv_kernel) * 10,
        dt_bias_H=torch.ones(heads), a_log_H=a_log, norm_D=torch.ones(spec.v_head_dim),
        out_proj=normal(d, spec.value_dim))
