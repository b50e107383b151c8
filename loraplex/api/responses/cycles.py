"""``GET /api/v1/loraplex/cycles`` as sent: each lane's cycle records after the poller's cursor,
columnar (`api.cycle_view.columns`: one array per field, times in integer µs)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CycleColumns(BaseModel):
    """One lane's records, one entry per record in each array; ``start_us`` counts from ``t0``
    (the first record's wall time, Unix seconds); ``tenants`` are indices into the response's
    ``tenants``, only those the viewer may see."""

    t0: float
    index: list[int]
    kind: list[str]
    start_us: list[int]
    engine_us: list[int]
    io_us: list[int]
    train_us: list[int]
    optim_us: list[int]
    idle_us: list[int]
    max_wait_us: list[int]
    num_tokens: list[int]
    num_ops: list[int]
    num_models: list[int]
    num_running: list[int]
    num_tenants: list[int]
    tenants: list[list[int]]


class LaneCyclesView(BaseModel):
    lane: str = Field(description="``{served name}/{worker}``")
    worker: str
    models: list[str]
    capacity: int = Field(description="most records the lane keeps")
    last_index: int | None = Field(description="the cursor to pass back (null: none yet)")
    cycles: CycleColumns


class CyclesResponse(BaseModel):
    lanes: list[LaneCyclesView]
    tenants: list[str]
    classes: dict[str, str] = Field(description="record kind → what the timeline colours")
    viewer: str
    is_operator: bool
