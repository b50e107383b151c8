"""`ExpertWeights`: the frozen router and experts of one sparse (mixture-of-experts) layer.

Experts are stacked so that one grouped GEMM runs them all: ``gate_up_E_2F_D`` holds each
expert's gate and up projections one above the other (``[gate; up]``, HF ``(out, in)``
layout), ``down_E_D_F`` its down projection. Hugging Face checkpoints (and what transformers'
``save_pretrained`` writes) store them per expert::

    model.layers.{i}.mlp.gate.weight                         (E, d)   the router
    model.layers.{i}.mlp.experts.{e}.gate_proj.weight        (f, d)
    model.layers.{i}.mlp.experts.{e}.up_proj.weight          (f, d)
    model.layers.{i}.mlp.experts.{e}.down_proj.weight        (d, f)

Checkpoints written from transformers' in-memory state dict (5.x fuses the experts) hold the
stacked tensors themselves, ``model.layers.{i}.mlp.experts.gate_up_proj`` ``(E, 2f, d)``
(``[gate; up]``) and ``...experts.down_proj`` ``(E, d, f)``; both layouts load. A shared expert
(Qwen3.5-MoE) is a dense gated MLP beside them, ``mlp.shared_expert.{gate,up,down}_proj``,
scaled by ``sigmoid(mlp.shared_expert_gate · h)`` (``(1, d)``).

Knows nothing about files (`checkpoint` reads them) or routing (`moe`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass

import torch

from loraplex.engine.model.moe_spec import ExpertSpec

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@dataclass
class SharedExpertWeights:
    """The shared expert's ``gate_proj``/``up_proj`` ``[fs, d]``, ``down_proj`` ``[d, fs]``
    and its gate ``[1, d]``."""

    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor
    gate_1_D: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.gate_proj, self.up_proj, self.down_proj, self.gate_1_D)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> SharedExpertWeights:
        return SharedExpertWeights(*(fn(t) for t in self.tensors()))


@dataclass
class ExpertBiases:
    """The router's bias ``[E]`` and the experts' ``[gate; up]`` ``[E, 2f]`` and down
    ``[E, d]`` biases (gpt-oss)."""

    router_E: torch.Tensor
    gate_up_E_2F: torch.Tensor
    down_E_D: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.router_E, self.gate_up_E_2F, self.down_E_D)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ExpertBiases:
        return ExpertBiases(*(fn(t) for t in self.tensors()))


@dataclass
class ExpertWeights:
    """Router ``[E, d]``, stacked ``[gate; up]`` ``[E, 2f, d]`` and down ``[E, d, f]``, and the
    shared expert or the biases where the family has them."""

    router_E_D: torch.Tensor
    gate_up_E_2F_D: torch.Tensor
    down_E_D_F: torch.Tensor
    shared: SharedExpertWeights | None = None
    biases: ExpertBiases | None = None

    @property
    def num_experts(self) -> int:
        return self.router_E_D.shape[0]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        shared = () if self.shared is None else self.shared.tensors()
        biases = () if self.biases is None else self.biases.tensors()
        return (self.router_E_D, self.gate_up_E_2F_D, self.down_E_D_F, *shared, *biases)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ExpertWeights:
        return ExpertWeights(fn(self.router_E_D), fn(self.gate_up_E_2F_D), fn(self.down_E_D_F),
                             None if self.shared is None else self.shared.map(fn),
                             None if self.biases is None else self.biases.map(fn))


def shared_names(layer: int) -> dict[str, str]:
    """`SharedExpertWeights` field → HF name."""
    base = f"model.layers.{layer}.mlp"
    return {"gate_proj": f"{base}.shared_expert.gate_proj.weight",
            "up_proj": f"{base}.shared_expert.up_proj.weight",
            "down_proj": f"{base}.shared_expert.down_proj.weight",
            "gate_1_D": f"{base}.shared_expert_gate.weight"}


def router_name(layer: int) -> str:
    return f"model.layers.{layer}.mlp.gate.weight"


def expert_name(layer: int, expert: int, projection: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{projection}.weight"


def fused_name(layer: int, tensor: str) -> str:
    """``model.layers.{layer}.mlp.experts.gate_up_proj`` / ``.down_proj`` (fused layout)."""
    return f"model.layers.{layer}.mlp.experts.{tensor}"


def expert_names(experts: ExpertSpec, layer: int, fused: bool = False) -> list[str]:
    """HF names of one sparse layer's router and experts (per expert, or fused), and of its
    shared expert."""
    shared = list(shared_names(layer).values()) if experts.shared_intermediate_size else []
    if fused:
        return [router_name(layer), fused_name(layer, "gate_up_proj"),
                fused_name(layer, "down_proj"), *shared]
    return [router_name(layer), *(expert_name(layer, e, p) for e in range(experts.num_experts)
                                  for p in PROJECTIONS), *shared]


def experts_from_hf(experts: ExpertSpec, layer: int,
                    tensors: MutableMapping[str, torch.Tensor],
                    transposed: bool = False) -> ExpertWeights:
    """Stack one layer's per-expert tensors, removing them from ``tensors`` as it goes (so a
    checkpoint's experts exist twice for one layer at most).

    Raises:
        KeyError: a tensor is missing (the caller turns it into a user error).
        ValueError: gate, up and down shapes do not fit together.

    ``transposed``: the fused tensors may be stored ``(E, d, 2f)`` and ``(E, f, d)``
    (Qwen3-VL-MoE's released checkpoints; transformers transposes them at load, and saves
    its own layout): told apart by their shapes.
    """
    shared = None
    if experts.shared_intermediate_size:
        shared = SharedExpertWeights(**{f: tensors.pop(n) for f, n in shared_names(layer).items()})
    if fused_name(layer, "gate_up_proj") in tensors:
        if transposed and _stored_transposed(experts, layer, tensors):
            for name in ("gate_up_proj", "down_proj"):
                key = fused_name(layer, name)
                tensors[key] = tensors[key].transpose(1, 2).contiguous()
        fused = _fused_from_hf(experts, layer, tensors)
        fused.shared = shared
        return fused
    gate_up, down = [], []
    for e in range(experts.num_experts):
        gate, up, d = (tensors.pop(expert_name(layer, e, p)) for p in PROJECTIONS)
        if gate.shape != up.shape or d.shape != gate.shape[::-1]:
            raise ValueError(f"layer {layer} expert {e}: gate {tuple(gate.shape)}, up "
                             f"{tuple(up.shape)}, down {tuple(d.shape)} do not fit")
        gate_up.append(torch.cat([gate, up]))
        down.append(d)
    return ExpertWeights(tensors.pop(router_name(layer)), torch.stack(gate_up),
                         torch.stack(down), shared)


def _stored_transposed(experts: ExpertSpec, layer: int,
                       tensors: MutableMapping[str, torch.Tensor]) -> bool:
    """Whether a layer's fused experts are in the released ``(E, d, 2f)`` / ``(E, f, d)``
    layout rather than transformers' ``(E, 2f, d)`` / ``(E, d, f)`` (by whichever tensor's
    shape tells them apart)."""
    f = experts.expert_intermediate_size
    down = tensors[fused_name(layer, "down_proj")].shape
    gate_up = tensors[fused_name(layer, "gate_up_proj")].shape
    if len(down) == 3 and down[1] != down[2]:
        return down[1] == f
    return len(gate_up) == 3 and gate_up[2] == 2 * f and gate_up[1] != 2 * f


def _fused_from_hf(experts: ExpertSpec, layer: int,
                   tensors: MutableMapping[str, torch.Tensor]) -> ExpertWeights:
    gate_up = tensors.pop(fused_name(layer, "gate_up_proj"))
    down = tensors.pop(fused_name(layer, "down_proj"))
    e, f = experts.num_experts, experts.expert_intermediate_size
    if gate_up.dim() != 3 or gate_up.shape[:2] != (e, 2 * f) or down.shape != (
            e, gate_up.shape[2], f):
        raise ValueError(f"layer {layer}: fused gate_up_proj {tuple(gate_up.shape)}, down_proj "
                         f"{tuple(down.shape)} do not fit {e} experts of width {f}")
    return ExpertWeights(tensors.pop(router_name(layer)), gate_up, down)


def expert_named_tensors(layer: int, weights: ExpertWeights, transposed: bool = False
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """HF names and (views of) the tensors, as `expert_names` lists them; ``transposed``:
    fused and transposed, as Qwen3-VL-MoE stores them."""
    f = weights.down_E_D_F.shape[2]
    yield router_name(layer), weights.router_E_D
    if transposed:
        yield fused_name(layer, "gate_up_proj"), weights.gate_up_E_2F_D.transpose(1, 2)
        yield fused_name(layer, "down_proj"), weights.down_E_D_F.transpose(1, 2)
        return
    for e in range(weights.num_experts):
        yield expert_name(layer, e, "gate_proj"), weights.gate_up_E_2F_D[e, :f]
        yield expert_name(layer, e, "up_proj"), weights.gate_up_E_2F_D[e, f:]
        yield expert_name(layer, e, "down_proj"), weights.down_E_D_F[e]
    if weights.shared is not None:
        for field_name, name in shared_names(layer).items():
            yield name, getattr(weights.shared, field_name)


def random_experts(experts: ExpertSpec, hidden_size: int,
                   normal: Callable[..., torch.Tensor]) -> ExpertWeights:
    """Seeded random router and experts (``normal(*shape)`` draws), for the built-ins."""
    e, d, f = experts.num_experts, hidden_size, experts.expert_intermediate_size
    weights = ExpertWeights(normal(e, d), normal(e, 2 * f, d), normal(e, d, f))
    fs = experts.shared_intermediate_size
    if fs:
        weights.shared = SharedExpertWeights(normal(fs, d), normal(fs, d), normal(d, fs),
                                             normal(1, d))
    return weights
