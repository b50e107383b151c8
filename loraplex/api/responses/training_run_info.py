"""What ``get_info`` answers about a training run (tinker-api.md §5.1): the SDK 0.38
``GetInfoResponse`` fields, in the order this server has always sent them, with the client's
``optimizer_config`` echoed as given."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, JsonValue
from tinker import types as sdk


class GetInfoResponse(BaseModel):
    type: Literal["get_info"]
    model_id: str
    model_data: sdk.ModelData
    is_lora: bool
    lora_rank: int
    model_name: str
    optimizer_config: dict[str, JsonValue]
