"""``GET /api/v1/loraplex/trace``: the kept cycle records as a Chrome / Perfetto trace (the JSON
trace-event format: ``{"traceEvents": [...]}``; open it in ui.perfetto.dev or chrome://tracing).

One process per lane (engine worker), one thread track per class: training cycles, sampling
steps, control and upkeep plans on the clock thread, and file work on IO threads (spread over
as many ``io`` tracks as overlap, since saves run in parallel). Each record is a complete event
(``ph: X``, microseconds of wall time) whose args carry its tenants, ops, tokens and the split
of its engine time; refused submits are instant events, and the decode batch size a counter.
Events on one track never overlap (Perfetto requires nesting), so a record whose start the
wall clock placed a hair before its predecessor's end is moved up to it. Tenant ids follow the
stats rule: an operator sees all, anyone else only its own.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from loraplex.api.auth import Caller
from loraplex.api.context import ctx_of
from loraplex.api.cycle_view import CLASS_OF_KIND, LaneCycles, lane_cycles, visible_tenants
from loraplex.errors import user_error
from loraplex.scheduler.metrics import CycleRecord

router = APIRouter(prefix="/api/v1")
TRACKS = {"training": 1, "sampling": 2, "control": 3, "admission": 4, "io": 10}
"""Thread id per class; IO records take tids 10, 11, ... as they overlap."""
MAX_LIMIT = 100_000


@router.get("/loraplex/trace")
async def trace(request: Request, caller: Caller, limit: int = MAX_LIMIT) -> JSONResponse:
    if not 0 <= limit <= MAX_LIMIT:
        raise user_error("limit", f"must be in [0, {MAX_LIMIT}], got {limit}")
    viewer = None if caller.is_operator else caller.tenant
    events: list[dict[str, Any]] = []
    for pid, lane in enumerate(lane_cycles(ctx_of(request), {}, limit), start=1):
        events += lane_events(pid, lane, viewer)
    body = {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "loraplex", "viewer": caller.tenant}}
    return JSONResponse(body, headers={
        "Content-Disposition": 'attachment; filename="loraplex-trace.json"'})


def lane_events(pid: int, lane: LaneCycles, viewer: str | None) -> list[dict[str, Any]]:
    """Metadata, cycle slices, admission instants and the decode-batch counter of one lane."""
    events = [_meta(pid, 0, "process_name", f"loraplex {lane.lane}"),
              _meta(pid, 0, "process_sort_index", pid, key="sort_index")]
    for name, tid in TRACKS.items():
        if name != "io":
            events.append(_meta(pid, tid, "thread_name", name))
    track_end: dict[int, float] = {}
    for record in sorted(lane.records, key=lambda r: r.wall_time):
        cls = CLASS_OF_KIND.get(record.kind, "control")
        tid = _io_track(track_end, record) if cls == "io" else TRACKS[cls]
        if cls == "io" and tid not in track_end:
            events.append(_meta(pid, tid, "thread_name", f"io {tid - TRACKS['io'] + 1}"))
        events.append(_slice(pid, tid, record, viewer, track_end))
        if record.kind == "sample":
            events.append({"ph": "C", "name": "decode batch", "pid": pid, "tid": 0,
                           "ts": events[-1]["ts"], "args": {"running": record.num_running}})
    for event in lane.view.scheduler.metrics.admissions.recent():
        if viewer is None or event.tenant == viewer:
            events.append({"ph": "i", "s": "t", "name": f"refused {event.kind}",
                           "cat": "admission", "pid": pid, "tid": TRACKS["admission"],
                           "ts": round(event.wall_time * 1e6, 3),
                           "args": {"tenant": event.tenant, "reason": event.reason}})
    return events


def _slice(pid: int, tid: int, record: CycleRecord, viewer: str | None,
           track_end: dict[int, float]) -> dict[str, Any]:
    start = record.wall_time * 1e6
    dur = max(record.engine_s, record.io_s) * 1e6
    end = start + dur
    start = max(start, track_end.get(tid, start))
    track_end[tid] = max(end, start)
    return {
        "ph": "X", "name": record.kind, "cat": CLASS_OF_KIND.get(record.kind, "control"),
        "pid": pid, "tid": tid, "ts": round(start, 3), "dur": round(max(0.0, end - start), 3),
        "args": {"index": record.index, "tenants": list(visible_tenants(record, viewer)),
                 "num_tenants": len(record.tenants), "num_ops": record.num_ops,
                 "num_models": record.num_models, "num_tokens": record.num_tokens,
                 "train_s": record.train_s, "optim_s": record.optim_s, "io_s": record.io_s,
                 "idle_before_s": record.idle_s, "overhead_s": record.overhead_s,
                 "max_wait_s": record.max_wait_s},
    }


def _io_track(track_end: dict[int, float], record: CycleRecord) -> int:
    """The first IO track free at ``record``'s start (a new one when all are busy)."""
    start = record.wall_time * 1e6
    tid = TRACKS["io"]
    while tid in track_end and track_end[tid] > start:
        tid += 1
    return tid


def _meta(pid: int, tid: int, name: str, value: object, key: str = "name") -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}
