"""PEFT-format export of one adapter, with the key names Tinker's downloads use.

Writes ``adapter_config.json`` (``peft_type`` LORA, ``r``, ``lora_alpha``, ``target_modules``,
``base_model_name_or_path``, ...) and ``adapter_model.safetensors`` with fp32 tensors named
``base_model.model.model.layers.N.<self_attn|mlp>.<proj>.lora_A.weight`` (r, in) and
``...lora_B.weight`` (out, r); the output head's LoRA is named as PEFT names an ``lm_head``
LoRA, ``base_model.model.lm_head.lora_{A,B}.weight``, so a plain
``peft.PeftModel.from_pretrained(base, dir)`` loads every tensor, head included, with no
missing keys (tied or untied: our head LoRA adapts the output projection only, exactly what
PEFT's ``lm_head`` LoRA does). Tinker's own downloads call the head ``model.unembed_tokens``;
the cookbook's ``weights`` tools take either name (they map ``unembed_tokens`` to ``lm_head``),
and `PEFT_KEY_MAPPING` still loads a Tinker-named file with PEFT.
"""

from __future__ import annotations

import os
from typing import Any

from loraplex.engine.checkpoint_io import write_json, write_safetensors
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.experts import EXPERT_TARGETS
from loraplex.engine.lora.targets import PEFT_PREFIX, UNEMBED, UNEMBED_MODULE_PATH, module_path

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
#: ``key_mapping`` for ``PeftModel.from_pretrained``: Tinker's head name → HF's ``lm_head``
#: (PEFT applies it after stripping ``base_model.model.``).
PEFT_KEY_MAPPING = {r"^model\.unembed_tokens\.": "lm_head."}
HF_HEAD_MODULE = "lm_head"
TINKER_HEAD = f"{PEFT_PREFIX}{UNEMBED_MODULE_PATH}."
PEFT_HEAD = f"{PEFT_PREFIX}{HF_HEAD_MODULE}."


def target_module_name(target: str) -> str:
    """The HF module name PEFT matches in ``target_modules`` (``lm_head`` for the head; an
    expert target keeps Tinker's name, ``w1``/``w2``/``w3``, as its 3-D tensors' keys do)."""
    if target in EXPERT_TARGETS:
        return target
    return HF_HEAD_MODULE if target == UNEMBED else module_path(target, 0).rsplit(".", 1)[-1]


def peft_adapter_config(adapter: LoraAdapter, base_model_name_or_path: str) -> dict[str, Any]:
    """PEFT's ``LoraConfig`` fields for ``adapter`` (scale = lora_alpha / r, no dropout)."""
    config = adapter.config
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(target_module_name(t) for t in adapter.weights),
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "revision": None,
    }


def write_peft_adapter(directory: str, adapter: LoraAdapter, base_model_name_or_path: str
                       ) -> None:
    """Write the two PEFT files of ``adapter`` into an existing ``directory`` (fsynced)."""
    write_json(os.path.join(directory, PEFT_CONFIG),
               peft_adapter_config(adapter, base_model_name_or_path))
    write_safetensors(os.path.join(directory, PEFT_WEIGHTS),
                      peft_named(adapter.peft_state_dict()), metadata={"format": "pt"})


def peft_named(state: dict[str, Any]) -> dict[str, Any]:
    """Tinker-named tensors with the head renamed to PEFT's ``lm_head``."""
    return {PEFT_HEAD + k[len(TINKER_HEAD):] if k.startswith(TINKER_HEAD) else k: v
            for k, v in state.items()}
