"""What a training run is: its id, owner, base model and adapter shape, fixed at creation.

Created by ``create_model`` (or by create-via-load, with the checkpoint's LoRA config); the
store persists it beside its counters, the scheduler orders its ops by ``model_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.domain.lora import LoraConfig


@dataclass(frozen=True)
class TrainingRun:
    """One training run (= a Tinker model id ``{session_id}:train:{n}``).

    Attributes:
        base_model: the served NAME it trains on.
        lora: rank and targets of its adapter.
        optimizer_config: the Tinker ``optimizer_config`` echoed by get_info (JSON).
        user_metadata: the client's metadata (JSON).
    """

    model_id: str
    tenant: str
    session_id: str
    base_model: str
    lora: LoraConfig
    optimizer_config: Mapping[str, Any]
    user_metadata: Mapping[str, Any]
