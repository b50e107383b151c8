"""Checkpoints of a model-parallel group: each stage hands over its share of an adapter
(`AdapterShare`), and `save_joined` writes the joined whole as one device would.

The group's ranks hold their layers' rows of every adapter tensor (`lora.stage_slices`);
joined in stage order they are the whole tensors, bit for bit, so the checkpoint directory
(manifest, weights, optimizer state, PEFT export) is byte-for-byte the format a single engine
writes, and loads under any number of stages. Reading is per stage (`checkpoint_io` cuts each
tensor), so no rank ever holds another's share. Knows nothing of processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.checkpoint_io import adapter_from_tensors, save_checkpoint
from loraplex.engine.lora import stage_slices
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.engine.peft_export import write_peft_adapter


@dataclass(frozen=True)
class AdapterShare:
    """One stage's tensors of one adapter (CPU copies, exact values).

    Attributes:
        config: the adapter's LoRA config.
        weights: `LoraAdapter.named_parameters` names → this stage's rows.
        optimizer: `OptimizerState.state_dict` names → this stage's rows (and the step); None
            when not asked for or the adapter is a frozen sampler copy.
    """

    config: LoraConfig
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor] | None


def save_joined(directory: str, shares: list[AdapterShare], spec: ModelSpec, model_dir: str,
                peft_export: bool) -> int:
    """Join the stages' shares (stage order) and write them as one checkpoint of the whole
    model (``spec``: the whole model's). Returns the bytes written."""
    config = shares[0].config
    adapter = adapter_from_tensors(spec, config, stage_slices.join([s.weights for s in shares]),
                                   trainable=False)
    optimizer = None
    if shares[0].optimizer is not None:
        named = adapter.named_parameters()
        state = stage_slices.join([s.optimizer or {} for s in shares])
        optimizer = OptimizerState.from_state_dict(state, [n for n, _ in named],
                                               [p for _, p in named])

    def peft(path: str) -> None:
        write_peft_adapter(path, adapter, model_dir)

    return save_checkpoint(directory, adapter, spec, optimizer, peft if peft_export else None)
