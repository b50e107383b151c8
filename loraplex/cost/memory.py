"""GPU memory: how a model is laid out over rented GPUs for serving, and what training adds.

A serving replica is the smallest power-of-two tensor-parallel group whose usable memory
(``memory_fraction`` of HBM) holds the weights with ``kv_reserve`` of it left for the KV cache;
GPUs are rented in whole nodes, filled with data-parallel replicas. Activation memory is not
modelled. Knows nothing of time or money.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loraplex.cost.cards.hardware import HardwareCard
from loraplex.cost.flops import TrainingMethod
from loraplex.domain.model_card import ModelCard
from loraplex.errors import user_error

MAX_TENSOR_PARALLEL = 1024
ADAM_STATE_BYTES_PER_PARAM = 16.0
"""Mixed-precision AdamW per trained parameter: 2 (bf16 weight) + 2 (bf16 gradient) + 4 (fp32
master weight) + 8 (two fp32 moments)."""


@dataclass(frozen=True)
class ReplicaLayout:
    """Serving replicas on the rented GPUs.

    Attributes:
        tensor_parallel: GPUs per replica.
        num_replicas: data-parallel replicas.
        num_gpus: GPUs rented (``tensor_parallel × num_replicas``).
        weight_bytes: weights of one replica.
        kv_capacity_bytes: KV-cache room of one replica (usable memory minus weights).
    """

    tensor_parallel: int
    num_replicas: int
    num_gpus: int
    weight_bytes: float
    kv_capacity_bytes: float


def plan_layout(card: ModelCard, hardware: HardwareCard, *, weight_bytes_per_param: float,
                num_gpus: int | None = None, tensor_parallel: int | None = None,
                memory_fraction: float = 0.9, kv_reserve: float = 0.25) -> ReplicaLayout:
    """Lay ``card`` out on ``hardware``.

    Args:
        weight_bytes_per_param: serving dtype (2 bf16, 1 fp8, ~0.55 int4 with scales).
        num_gpus: GPUs rented; None rounds the replica up to whole nodes.
        tensor_parallel: GPUs per replica; None picks the smallest power of two that leaves
            ``kv_reserve`` of the usable memory for the KV cache.

    Raises:
        UserError: the weights do not fit, or the counts do not divide.
    """
    weights = card.weight_bytes(weight_bytes_per_param)
    usable = memory_fraction * hardware.hbm_bytes
    if tensor_parallel is None:
        tensor_parallel = 1
        while weights > usable * tensor_parallel * (1.0 - kv_reserve):
            tensor_parallel *= 2
            if tensor_parallel > MAX_TENSOR_PARALLEL:
                raise user_error("tensor_parallel", f"{card.name} does not fit on "
                                 f"{MAX_TENSOR_PARALLEL} × {hardware.name}")
    if tensor_parallel < 1:
        raise user_error("tensor_parallel", f"must be ≥ 1, got {tensor_parallel}")
    if num_gpus is None:
        num_gpus = hardware.node_size * math.ceil(tensor_parallel / hardware.node_size)
    if num_gpus < tensor_parallel or num_gpus % tensor_parallel:
        raise user_error("num_gpus", f"{num_gpus} GPUs do not split into replicas of "
                         f"tensor_parallel={tensor_parallel}")
    kv_capacity = usable * tensor_parallel - weights
    if kv_capacity <= 0:
        raise user_error("num_gpus", f"{card.name} weights ({weights / 1e9:.0f} GB) exceed the "
                         f"usable memory of {tensor_parallel} × {hardware.name}")
    return ReplicaLayout(tensor_parallel, num_gpus // tensor_parallel, num_gpus, weights,
                         kv_capacity)


def training_state_bytes(card: ModelCard, method: TrainingMethod) -> float:
    """Trained weights, gradients and AdamW moments (the frozen base not included).

    LoRA trains only the adapters; full fine-tuning trains every weight (sharded by FSDP
    over all GPUs in practice).
    """
    if method.kind == "full":
        return card.total_params * ADAM_STATE_BYTES_PER_PARAM
    c = method.lora
    adapter = card.lora_params(c.rank, attn=c.train_attn, mlp=c.train_mlp,
                               unembed=c.train_unembed)
    return adapter * ADAM_STATE_BYTES_PER_PARAM


def require_training_fits(card: ModelCard, method: TrainingMethod, layout: ReplicaLayout,
                          hardware: HardwareCard, memory_fraction: float = 0.9) -> None:
    """Check that the served weights plus the training state fit the rented GPUs (sharded).

    Raises:
        UserError: they do not; the message says how much is missing.
    """
    need = layout.weight_bytes * layout.num_replicas + training_state_bytes(card, method)
    have = memory_fraction * hardware.hbm_bytes * layout.num_gpus
    if need > have:
        raise user_error("num_gpus", f"{method.kind} training of {card.name} needs "
                         f"{need / 1e9:,.0f} GB but {layout.num_gpus} × {hardware.name} offer "
                         f"{have / 1e9:,.0f} GB")
