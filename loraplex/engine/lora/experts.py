"""LoRA on routed experts, parameterised as Tinker does it.

``train_mlp`` on a mixture-of-experts model adapts every expert's gate, up and down projection
(Tinker's internal names ``w1``, ``w3``, ``w2``). The LoRA factor on the model's hidden
dimension is shared by all experts of a layer, the factor on the expert's own width is per
expert (the cookbook's ``hyperparam_utils.get_lora_param_count`` docstring: "the LoRA factor
connected to the model hidden dimension is shared across experts, while the other factor
remains expert-specific"; its ``weights`` tests save exactly these shapes)::

    w1 (gate), w3 (up):  A (1, r, d) shared,    B (E, f, r) per expert
    w2 (down):           A (E, r, f) per expert, B (1, d, r) shared

so a layer holds ``3·r·(d + E·f)`` adapter parameters (Qwen3-30B-A3B: 48 layers × 3 × (2048 +
128·768) = 14,450,688 per unit of rank, the cookbook's table value). Exported as 3-D tensors
``base_model.model.model.layers.N.mlp.experts.w1.lora_A.weight`` etc., which the cookbook's
``weights.build_hf_model`` broadcasts and merges per expert. The router is never adapted
(Tinker's flags have no router target and its counts include none).
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.engine.model.moe import SHARED_TARGETS
from loraplex.engine.model.spec import ModelSpec

EXPERT_TARGETS = ("w1", "w3", "w2")
#: A shared expert's projections (Qwen3.5-MoE, `moe.SHARED_TARGETS`), adapted like a dense
#: MLP in every sparse layer.
__all__ = ["EXPERT_TARGETS", "SHARED_TARGETS"]
#: Tinker's expert target → the HF projection it adapts.
HF_PROJECTION = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@dataclass(frozen=True)
class ExpertDims:
    """Shapes of one expert target (see the module docstring)."""

    layers: tuple[int, ...]
    d_in: int
    d_out: int
    a_experts: int
    b_experts: int


def expert_dims(spec: ModelSpec, target: str) -> ExpertDims:
    experts = spec.experts
    if experts is None:
        raise ValueError(f"{target}: the model has no experts")
    d, f, e = spec.hidden_size, experts.expert_intermediate_size, experts.num_experts
    if target == "w2":
        return ExpertDims(experts.sparse_layers, f, d, a_experts=e, b_experts=1)
    return ExpertDims(experts.sparse_layers, d, f, a_experts=1, b_experts=e)


def expert_module_path(target: str, layer: int) -> str:
    """``model.layers.{layer}.mlp.experts.w1``-style path (Tinker's export names); a shared
    expert's ``model.layers.{layer}.mlp.shared_expert.gate_proj``."""
    if target in SHARED_TARGETS:
        return f"model.layers.{layer}.mlp.shared_expert.{target.removeprefix('shared_')}"
    return f"model.layers.{layer}.mlp.experts.{target}"


def shared_dims(spec: ModelSpec, target: str) -> tuple[tuple[int, ...], int, int]:
    """A shared-expert target's (layers, d_in, d_out)."""
    experts = spec.experts
    if experts is None or not experts.shared_intermediate_size:
        raise ValueError(f"{target}: the model has no shared expert")
    d, fs = spec.hidden_size, experts.shared_intermediate_size
    return experts.sparse_layers, (fs if target == "shared_down_proj" else d), (
        d if target == "shared_down_proj" else fs)
