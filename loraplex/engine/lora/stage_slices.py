"""A pipeline stage's share of an adapter: which rows (the layer axis) of each whole-model
LoRA tensor it holds, and the cutting and joining of whole-model tensors.

A stage's adapter holds, per target, the copies of the layers the stage runs (the unembed
target on the last stage only), as the leading rows of the whole adapter's ``[layers, ...]``
tensors; AdamW moments have the same shapes. Cutting a whole checkpoint's tensors gives a
stage its share bit for bit, and joining every stage's shares in stage order gives the whole
tensors back, so a checkpoint saved under ``--model-parallel N`` is the same file as on one
device. Knows nothing about processes or files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.targets import target_shape, targets_of
from loraplex.engine.model.spec import ModelSpec


def stage_rows(spec: ModelSpec, target: str) -> slice:
    """The rows of the whole model's ``target`` tensors that ``spec`` (a stage's, or a whole
    model's: all) holds."""
    whole = target_shape(spec.whole_spec, target).layers
    mine = target_shape(spec, target).layers
    if not mine:
        return slice(0, 0)
    first = whole.index(mine[0])
    return slice(first, first + len(mine))


def target_of_name(name: str) -> str:
    """``exp_avg.q_proj.lora_A`` / ``q_proj.lora_A`` → ``q_proj``."""
    return name.rsplit(".", 2)[-2]


def cut(spec: ModelSpec, config: LoraConfig, tensors: Mapping[str, torch.Tensor]
        ) -> dict[str, torch.Tensor]:
    """A stage's share of whole-model adapter (or AdamW) tensors: each target's rows, targets
    the stage does not hold dropped; names without a target (the step count) kept."""
    if spec.stage is None:
        return dict(tensors)
    mine = set(targets_of(config, spec))
    out = {}
    for name, t in tensors.items():
        if "lora_" not in name:
            out[name] = t
            continue
        target = target_of_name(name)
        if target in mine:
            out[name] = t[stage_rows(spec, target)].clone()
    return out


def join(shares: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Whole-model tensors from every stage's share, in stage order (a name held by one stage
    only, like the unembed target, is that stage's tensor; a scalar like the step count is
    the first stage's)."""
    names: dict[str, list[torch.Tensor]] = {}
    for share in shares:
        for name, t in share.items():
            names.setdefault(name, []).append(t)
    return {name: parts[0] if parts[0].dim() == 0 or len(parts) == 1 else torch.cat(parts)
            for name, parts in names.items()}
