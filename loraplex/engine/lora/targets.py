"""The modules a LoRA adapter can adapt, their shapes, and their PEFT/Tinker key names.

Targets are the seven linears of every decoder block plus the output head (``unembed``,
exported as ``base_model.model.model.unembed_tokens`` per the Tinker cookbook's convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.domain.lora import LoraConfig
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.weights import hf_module_path

ATTN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
UNEMBED = "unembed"
ALL_TARGETS = (*ATTN_TARGETS, *MLP_TARGETS, UNEMBED)
UNEMBED_MODULE_PATH = "model.unembed_tokens"
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class TargetShape:
    """One target's LoRA shape: ``num_layers`` copies of ``A (r, d_in)`` and ``B (d_out, r)``."""

    num_layers: int
    d_in: int
    d_out: int


def targets_of(config: LoraConfig) -> tuple[str, ...]:
    """The targets a config trains, in canonical order."""
    chosen = (ATTN_TARGETS if config.train_attn else ()) + (
        MLP_TARGETS if config.train_mlp else ()) + ((UNEMBED,) if config.train_unembed else ())
    return tuple(t for t in ALL_TARGETS if t in chosen)


def target_shape(spec: ModelSpec, target: str) -> TargetShape:
    d, q, kv, ff = spec.hidden_size, spec.q_size, spec.kv_size, spec.intermediate_size
    d_in, d_out = {
        "q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
        "gate_proj": (d, ff), "up_proj": (d, ff), "down_proj": (ff, d),
        UNEMBED: (d, spec.vocab_size),
    }[target]
    return TargetShape(1 if target == UNEMBED else spec.num_layers, d_in, d_out)


def module_path(target: str, layer: int) -> str:
    """HF module path of a target in one layer (``model.unembed_tokens`` for the head)."""
    return UNEMBED_MODULE_PATH if target == UNEMBED else hf_module_path(layer, target)


def peft_key(target: str, layer: int, which: str) -> str:
    """``base_model.model.<module path>.lora_A.weight`` (``which`` is ``A`` or ``B``)."""
    return f"{PEFT_PREFIX}{module_path(target, layer)}.lora_{which}.weight"
