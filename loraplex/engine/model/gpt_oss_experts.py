"""gpt-oss's router and experts as its checkpoints store them, and the MXFP4 experts OpenAI ships.

transformers' ``GptOssMLP`` names, per layer ``model.layers.{i}.mlp.``::

    router.weight (E, d), router.bias (E,)
    experts.gate_up_proj (E, d, 2f)   x @ W, gate and up INTERLEAVED: columns g0 u0 g1 u1 …
    experts.gate_up_proj_bias (E, 2f) interleaved the same way
    experts.down_proj (E, f, d)       x @ W
    experts.down_proj_bias (E, d)

OpenAI's release quantises the experts' two matrices to MXFP4 (OCP microscaling: blocks of 32
FP4 e2m1 values, two per byte, low nibble first, sharing one power-of-two scale stored as a
biased exponent, 127 = 2⁰): ``experts.gate_up_proj_blocks`` (E, 2f, d/32, 16) with
``gate_up_proj_scales`` (E, 2f, d/32), ``experts.down_proj_blocks`` (E, d, f/32, 16) with
``down_proj_scales`` (E, d, f/32): rows are the output features. They are dequantised at load
(`dequantize_mxfp4`; the values are exact in fp32 and bf16). Everything becomes the engine's
`ExpertWeights` layout: ``[gate; up]`` rows (de-interleaved) ``(E, 2f, d)``, down ``(E, d, f)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping

import torch

from loraplex.engine.model.expert_weights import ExpertBiases, ExpertWeights
from loraplex.engine.model.moe_spec import ExpertSpec

#: FP4 e2m1: sign, two exponent bits, one mantissa bit (code → value).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_BLOCK = 32
SCALE_BIAS = 127


def dequantize_mxfp4(blocks_X_G_B: torch.Tensor, scales_X_G: torch.Tensor) -> torch.Tensor:
    """``[..., G·2B]`` fp32 values of MXFP4 ``blocks`` (``[..., G, B]`` bytes) and their
    ``scales`` (``[..., G]`` biased exponents)."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks_X_G_B.device)
    codes = blocks_X_G_B.to(torch.uint8)
    low, high = lut[(codes & 0x0F).long()], lut[(codes >> 4).long()]
    values = torch.stack([low, high], dim=-1).flatten(-2)  # [..., G, 2B]: low nibble first
    exponent = scales_X_G.to(torch.int32) - SCALE_BIAS
    return torch.ldexp(values, exponent[..., None]).flatten(-2)


def names(layer: int, quantized: bool) -> list[str]:
    """One layer's router and expert tensor names (MXFP4 blocks and scales when
    ``quantized``)."""
    base = f"model.layers.{layer}.mlp"
    matrices = ([f"{base}.experts.{m}_{part}" for m in ("gate_up_proj", "down_proj")
                 for part in ("blocks", "scales")] if quantized else
                [f"{base}.experts.gate_up_proj", f"{base}.experts.down_proj"])
    return [f"{base}.router.weight", f"{base}.router.bias", *matrices,
            f"{base}.experts.gate_up_proj_bias", f"{base}.experts.down_proj_bias"]


def is_quantized(layer: int, names_present: set[str] | frozenset[str]) -> bool:
    return f"model.layers.{layer}.mlp.experts.gate_up_proj_blocks" in names_present


def from_hf(experts: ExpertSpec, layer: int, tensors: MutableMapping[str, torch.Tensor]
            ) -> ExpertWeights:
    """One layer's experts in the engine's layout (removed from ``tensors`` as they go)."""
    base = f"model.layers.{layer}.mlp"
    dtype = tensors[f"{base}.router.weight"].dtype
    if f"{base}.experts.gate_up_proj_blocks" in tensors:
        def packed(m: str) -> torch.Tensor:
            return dequantize_mxfp4(tensors.pop(f"{base}.experts.{m}_blocks"),
                                    tensors.pop(f"{base}.experts.{m}_scales")).to(dtype)
        gate_up_E_2F_D, down_E_D_F = packed("gate_up_proj"), packed("down_proj")
    else:  # x @ W layouts
        gate_up_E_2F_D = tensors.pop(f"{base}.experts.gate_up_proj").transpose(1, 2)
        down_E_D_F = tensors.pop(f"{base}.experts.down_proj").transpose(1, 2)
    e, f = experts.num_experts, experts.expert_intermediate_size
    if gate_up_E_2F_D.shape[:2] != (e, 2 * f) or down_E_D_F.shape[::2] != (e, f):
        raise ValueError(f"layer {layer}: experts {tuple(gate_up_E_2F_D.shape)} / "
                         f"{tuple(down_E_D_F.shape)} do not fit {e} experts of width {f}")
    gate_up_bias = tensors.pop(f"{base}.experts.gate_up_proj_bias")
    return ExpertWeights(
        tensors.pop(f"{base}.router.weight"),
        _deinterleave(gate_up_E_2F_D, 1).contiguous(), down_E_D_F.contiguous(),
        biases=ExpertBiases(tensors.pop(f"{base}.router.bias"),
                            _deinterleave(gate_up_bias, 1).contiguous(),
                            tensors.pop(f"{base}.experts.down_proj_bias")))


def named_tensors(layer: int, weights: ExpertWeights) -> Iterator[tuple[str, torch.Tensor]]:
    """The layer's tensors as transformers' ``GptOssMLP`` stores them (unquantised)."""
    assert weights.biases is not None
    base = f"model.layers.{layer}.mlp"
    yield f"{base}.router.weight", weights.router_E_D
    yield f"{base}.router.bias", weights.biases.router_E
    yield f"{base}.experts.gate_up_proj", _interleave(weights.gate_up_E_2F_D, 1).transpose(1, 2)
    yield f"{base}.experts.gate_up_proj_bias", _interleave(weights.biases.gate_up_E_2F, 1)
    yield f"{base}.experts.down_proj", weights.down_E_D_F.transpose(1, 2)
    yield f"{base}.experts.down_proj_bias", weights.biases.down_E_D


def random_biases(experts: ExpertSpec, hidden: int,
                  normal: Callable[..., torch.Tensor]) -> ExpertBiases:
    e, f = experts.num_experts, experts.expert_intermediate_size
    return ExpertBiases(normal(e), normal(e, 2 * f), normal(e, hidden))


def _deinterleave(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``g0 u0 g1 u1 …`` along ``dim`` → ``[g0 g1 …; u0 u1 …]``."""
    gate = x.narrow(dim, 0, x.shape[dim]).unflatten(dim, (-1, 2))
    return torch.cat([gate.select(dim + 1, 0), gate.select(dim + 1, 1)], dim=dim)


def _interleave(x: torch.Tensor, dim: int) -> torch.Tensor:
    """`_deinterleave`'s inverse."""
    gate, up = x.chunk(2, dim=dim)
    return torch.stack([gate, up], dim=dim + 1).flatten(dim, dim + 1)
