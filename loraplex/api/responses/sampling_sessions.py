"""What ``retrieve_futures`` answers (tinker-api.md §4.7): the samples of one SamplingClient
that finished or failed since its cursor, shaped as the SDK 0.38's ``FuturesRetrieveResponse``
parses them (its payloads then come from ``retrieve_future``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class FutureCompletion(BaseModel):
    """One completed sample; ``response_payload_uncompressed_size`` is set (to null: not
    known up front) only on a finished one."""

    state: Literal["finished", "failed"]
    request_id: str
    response_payload_uncompressed_size: int | None = None


class FuturesRetrieveResponse(BaseModel):
    completions: list[FutureCompletion]
    cursor: int
