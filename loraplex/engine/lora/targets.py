"""The modules a LoRA adapter can adapt, their shapes, and their PEFT/Tinker key names.

Targets are the seven linears of every decoder block plus the output head (``unembed``,
exported as ``base_model.model.model.unembed_tokens`` per the Tinker cookbook's convention).
In a mixture-of-experts model ``train_mlp`` adapts every expert instead of the dense MLP (the
three expert targets ``w1``/``w3``/``w2``, Tinker's names for gate/up/down, whose shapes are in
`engine.lora.experts`), and the dense MLP of the layers that keep one. A hybrid model's
(Qwen3.5) attention targets are its full-attention layers' four projections (a gated query
projection twice as wide) and its linear-attention layers' ``in_proj_q``/``k``/``v`` (the
slices of ``in_proj_qkv``, adapted separately as Tinker does), ``in_proj_z`` and
``out_proj``, exported under ``linear_attn``.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.experts import (
    EXPERT_TARGETS,
    SHARED_TARGETS,
    expert_dims,
    expert_module_path,
    shared_dims,
)
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.weights import hf_module_path

ATTN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
LINEAR_ATTN_TARGETS = ("in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z", "out_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
UNEMBED = "unembed"
ALL_TARGETS = (*ATTN_TARGETS, *LINEAR_ATTN_TARGETS, *MLP_TARGETS, *EXPERT_TARGETS,
               *SHARED_TARGETS, UNEMBED)
UNEMBED_MODULE_PATH = "model.unembed_tokens"
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class TargetShape:
    """One target's LoRA shape: ``num_layers`` copies of ``A (r, d_in)`` and ``B (d_out, r)``.

    Attributes:
        layers: the model layer of each copy.
        a_experts, b_experts: an expert target's ``A``/``B`` carry an expert axis of this
            length (``1``: one factor shared by every expert); 0 for the other targets.
    """

    num_layers: int
    d_in: int
    d_out: int
    layers: tuple[int, ...] = ()
    a_experts: int = 0
    b_experts: int = 0

    @property
    def is_expert(self) -> bool:
        return self.a_experts > 0

    def a_shape(self, rank: int) -> tuple[int, ...]:
        """``[layers, rank, d_in]``, or ``[layers, a_experts, rank, d_in]``."""
        experts = (self.a_experts,) if self.is_expert else ()
        return (self.num_layers, *experts, rank, self.d_in)

    def b_shape(self, rank: int) -> tuple[int, ...]:
        """``[layers, d_out, rank]``, or ``[layers, b_experts, d_out, rank]``."""
        experts = (self.b_experts,) if self.is_expert else ()
        return (self.num_layers, *experts, self.d_out, rank)


def targets_of(config: LoraConfig, spec: ModelSpec | None = None) -> tuple[str, ...]:
    """The targets a config trains on ``spec``'s model, in canonical order (without a spec:
    a dense model's)."""
    mlp: tuple[str, ...] = ()
    if config.train_mlp:
        sparse = spec is not None and spec.experts is not None
        dense = spec is None or bool(spec.dense_mlp_layers)
        shared = sparse and spec is not None and spec.experts is not None and bool(
            spec.experts.shared_intermediate_size)
        mlp = ((MLP_TARGETS if dense else ()) + (EXPERT_TARGETS if sparse else ())
               + (SHARED_TARGETS if shared else ()))
    unembed = config.train_unembed and (spec is None or spec.holds_head)
    attn: tuple[str, ...] = ()
    if config.train_attn:
        attn = ((ATTN_TARGETS if spec is None or spec.attention_layers else ())
                + (LINEAR_ATTN_TARGETS if spec is not None and spec.linear_layers else ()))
    chosen = attn + mlp + ((UNEMBED,) if unembed else ())
    return tuple(t for t in ALL_TARGETS if t in chosen)


def target_shape(spec: ModelSpec, target: str) -> TargetShape:
    """One target's shape on ``spec``'s layers (a pipeline stage's: its own, ``layers``
    numbered as in the whole model)."""
    first = spec.first_layer
    if target in SHARED_TARGETS:
        layers, d_in, d_out = shared_dims(spec, target)
        return TargetShape(len(layers), d_in, d_out, tuple(first + i for i in layers))
    if target in EXPERT_TARGETS:
        dims = expert_dims(spec, target)
        return TargetShape(len(dims.layers), dims.d_in, dims.d_out,
                           tuple(first + i for i in dims.layers), dims.a_experts, dims.b_experts)
    d, q, kv, ff = spec.hidden_size, spec.q_size, spec.kv_size, spec.intermediate_size
    shapes = {
        "q_proj": (d, spec.q_proj_size), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
        "gate_proj": (d, ff), "up_proj": (d, ff), "down_proj": (ff, d),
        UNEMBED: (d, spec.vocab_size),
    }
    if spec.linear is not None:
        lin = spec.linear
        shapes |= {"in_proj_q": (d, lin.key_dim), "in_proj_k": (d, lin.key_dim),
                   "in_proj_v": (d, lin.value_dim), "in_proj_z": (d, lin.value_dim),
                   "out_proj": (lin.value_dim, d)}
    d_in, d_out = shapes[target]
    layers = ((0,) if target == UNEMBED else spec.dense_mlp_layers if target in MLP_TARGETS
              else spec.linear_layers if target in LINEAR_ATTN_TARGETS
              else spec.attention_layers)
    if target != UNEMBED:
        layers = tuple(first + i for i in layers)
    return TargetShape(len(layers), d_in, d_out, layers)


def module_path(target: str, layer: int) -> str:
    """HF module path of a target in one layer (``model.unembed_tokens`` for the head)."""
    if target in EXPERT_TARGETS or target in SHARED_TARGETS:
        return expert_module_path(target, layer)
    if target in LINEAR_ATTN_TARGETS:
        return f"model.layers.{layer}.linear_attn.{target}"
    return UNEMBED_MODULE_PATH if target == UNEMBED else hf_module_path(layer, target)


def peft_key(target: str, layer: int, which: str) -> str:
    """``base_model.model.<module path>.lora_A.weight`` (``which`` is ``A`` or ``B``)."""
    return f"{PEFT_PREFIX}{module_path(target, layer)}.lora_{which}.weight"
