"""``GET /api/v1/loraplex/cycles``: the clock cycles behind the dashboard's timeline.

Each lane's newest ``limit`` kept cycle records after the poller's cursor (``after=LANE:INDEX``,
repeatable; none: from the oldest kept), columnar with times in integer µs
(`loraplex.api.cycle_view.columns`), oldest first.
A poller passes back each lane's ``last_index`` and gets only what is new. Tenant ids follow
the stats rule: an operator sees all, anyone else only its own.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from loraplex.api.auth import Caller
from loraplex.api.context import ctx_of
from loraplex.api.cycle_view import CLASS_OF_KIND, columns, lane_cycles, parse_cursors
from loraplex.api.responses.cycles import CyclesResponse, LaneCyclesView
from loraplex.errors import user_error

router = APIRouter(prefix="/api/v1")
MAX_LIMIT = 100_000


@router.get("/loraplex/cycles", response_model_exclude_unset=True)
async def cycles(request: Request, caller: Caller,
                 after: Annotated[list[str] | None, Query()] = None,
                 limit: int = 10_000) -> CyclesResponse:
    if not 0 <= limit <= MAX_LIMIT:
        raise user_error("limit", f"must be in [0, {MAX_LIMIT}], got {limit}")
    viewer = None if caller.is_operator else caller.tenant
    names: dict[str, int] = {}
    lanes = []
    for lane in lane_cycles(ctx_of(request), parse_cursors(after or []), limit):
        kept = lane.records
        lanes.append(LaneCyclesView(
            lane=lane.lane, worker=lane.view.worker, models=lane.view.names,
            capacity=lane.capacity, last_index=kept[-1].index if kept else None,
            cycles=columns(kept, viewer, names)))
    # Sent by pydantic's JSON encoder (FastAPI's fast path for a response model): 10,000
    # records are 16 arrays of plain ints, encoded in Rust without a Python dict between.
    return CyclesResponse(lanes=lanes, tenants=list(names), classes=CLASS_OF_KIND,
                          viewer=caller.tenant, is_operator=caller.is_operator)
