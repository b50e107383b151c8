"""Seconds on rented GPUs: compute-bound phases at MFU, bandwidth-bound decode at MBU.

Prefill and training are compute-bound: ``t = FLOPs / (GPUs · peak · MFU)``. Decode at RL
batch sizes is bandwidth-bound: every iteration a replica streams its weights once (for MoE,
only the experts its in-flight tokens picked) plus the KV cache of every sequence in its batch:

    t_iter = (W_read(b) + Σ_i kv(ctx_i)) / (TP · HBM_bandwidth · MBU)

A replica decodes ``b`` = min(its rollouts, what its KV cache holds) sequences at a time, in
``ceil(rollouts / b)`` waves. Knows nothing of money or of workloads' step structure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loraplex.cost.cards.hardware import HardwareCard
from loraplex.cost.flops import attended_positions
from loraplex.cost.memory import ReplicaLayout
from loraplex.domain.model_card import ModelCard
from loraplex.errors import user_error


def compute_seconds(flops: float, hardware: HardwareCard, num_gpus: int, mfu: float) -> float:
    """Wall seconds of a compute-bound phase spread over ``num_gpus`` at utilisation ``mfu``."""
    _require_fraction("mfu", mfu)
    return flops / (num_gpus * hardware.peak_flops * mfu)


def bandwidth_seconds(num_bytes: float, hardware: HardwareCard, num_gpus: int,
                      mbu: float) -> float:
    """Wall seconds to stream ``num_bytes`` from HBM over ``num_gpus`` at utilisation ``mbu``."""
    _require_fraction("mbu", mbu)
    return num_bytes / (num_gpus * hardware.hbm_bandwidth * mbu)


def _require_fraction(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise user_error(name, f"must be in (0, 1], got {value}")


@dataclass(frozen=True)
class DecodeTime:
    """One decode phase (every rollout generates ``new_tokens`` after ``context``).

    Attributes:
        weights_s: time streaming weights.
        kv_s: time streaming KV caches.
        batch: sequences a replica decodes concurrently.
        waves: sequential batches per replica.
    """

    weights_s: float
    kv_s: float
    batch: int
    waves: int

    @property
    def total_s(self) -> float:
        return self.weights_s + self.kv_s


def kv_bytes_read_during_decode(card: ModelCard, context: float, new_tokens: float,
                                bytes_per_value: float = 2.0) -> float:
    """KV bytes one sequence streams while generating ``new_tokens`` after ``context``:
    ``Σ_j kv(context + j)``, i.e. ``kv_tok · (d·c + d²/2)`` for full-attention layers."""
    window = card.sliding_window
    return (card.kv_bytes_per_token(bytes_per_value) * attended_positions(context, new_tokens)
            + card.kv_bytes_sliding_per_token(bytes_per_value)
            * attended_positions(context, new_tokens, window))


def decode_seconds(card: ModelCard, layout: ReplicaLayout, hardware: HardwareCard, *,
                   rollouts: int, context: float, new_tokens: float,
                   weight_bytes_per_param: float, mbu: float) -> DecodeTime:
    """Time for ``rollouts`` sequences (spread over the replicas) to each generate
    ``new_tokens`` after a prompt of ``context`` tokens.

    Raises:
        UserError: one sequence's KV cache does not fit a replica.
    """
    if new_tokens <= 0 or rollouts <= 0:
        return DecodeTime(0.0, 0.0, 0, 0)
    per_replica = math.ceil(rollouts / layout.num_replicas)
    seq_bytes = card.kv_bytes(context + new_tokens)
    fits = math.floor(layout.kv_capacity_bytes / seq_bytes)
    if fits < 1:
        raise user_error("num_gpus", f"one {context + new_tokens:,.0f}-token sequence needs "
                         f"{seq_bytes / 1e9:.1f} GB of KV cache; a replica has "
                         f"{layout.kv_capacity_bytes / 1e9:.1f} GB")
    batch = min(per_replica, fits)
    waves = math.ceil(per_replica / batch)
    weights_per_iter = card.decode_weight_read_bytes(batch, weight_bytes_per_param)
    weights_s = bandwidth_seconds(waves * new_tokens * weights_per_iter, hardware,
                                  layout.tensor_parallel, mbu)
    kv_total = rollouts * kv_bytes_read_during_decode(card, context, new_tokens)
    kv_s = bandwidth_seconds(kv_total, hardware, layout.num_gpus, mbu)
    return DecodeTime(weights_s, kv_s, batch, waves)
