"""Cycle records as the dashboard's timeline and the trace export read them: each lane's kept
records after a cursor, columnar (one array per field, so 10,000 records are one small JSON
object rather than 10,000), with tenant ids shown only to whom may see them.

An operator sees every tenant of every record. A tenant sees every record (how busy the machine
is), but in each only its own id and the number of tenants the record carried (as in
``/api/v1/loraplex/stats``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from loraplex.api.context import ServerContext
from loraplex.api.lane_views import LaneView, served_schedulers
from loraplex.api.responses.cycles import CycleColumns
from loraplex.errors import user_error
from loraplex.scheduler.metrics import CycleRecord

CLASS_OF_KIND = {"cycle": "training", "sample": "sampling", "control": "control",
                 "install": "control", "expire": "control", "release": "control", "io": "io"}
"""What the timeline colours a record by: training cycles, sampling steps, control and upkeep
plans (create, snapshot, install, expire, release), and file work on IO threads."""


INDEX = re.compile(r"-?[0-9]{1,18}")


@dataclass(frozen=True)
class LaneCycles:
    """One lane's records after the caller's cursor.

    Attributes:
        lane: ``{served name}/{worker}``, unique over the server.
        capacity: most records the lane keeps.
    """

    lane: str
    view: LaneView
    capacity: int
    records: list[CycleRecord]


def lane_id(view: LaneView) -> str:
    return f"{view.names[0]}/{view.worker}"


def parse_cursors(after: Iterable[str]) -> dict[str, int]:
    """``LANE:INDEX`` strings (the last index a poller has of each lane) → a dict.

    Raises:
        UserError: a value without ``:`` or with a non-integer index.
    """
    out = {}
    for value in after:
        lane, sep, index = value.rpartition(":")
        if not sep or not lane or not INDEX.fullmatch(index):
            raise user_error("after", f"expected LANE:INDEX, got {value!r}")
        out[lane] = int(index)
    return out


def lane_cycles(ctx: ServerContext, after: Mapping[str, int], limit: int) -> list[LaneCycles]:
    """Every live lane's newest ``limit`` records after its cursor (-1 when not given)."""
    out = []
    for view in served_schedulers(ctx):
        lane = lane_id(view)
        metrics = view.scheduler.metrics
        out.append(LaneCycles(lane, view, metrics.capacity,
                              metrics.after(after.get(lane, -1), limit)))
    return out


def visible_tenants(record: CycleRecord, viewer: str | None) -> tuple[str, ...]:
    """The tenant ids of ``record`` that ``viewer`` may see (None: an operator, all)."""
    return tuple(t for t in record.tenants if viewer is None or t == viewer)


def columns(records: list[CycleRecord], viewer: str | None, names: dict[str, int]
            ) -> CycleColumns:
    """``records`` as one list per field; tenants as indices into ``names`` (extended here).

    Times are integer microseconds (integers encode and parse faster than floats, and a µs is
    finer than any plan): ``start_us`` after ``t0`` (the first record's wall time, Unix
    seconds), and ``engine_us``, ``io_us``, ... for the durations."""
    t0 = records[0].wall_time if records else 0.0

    def us(seconds: list[float]) -> list[int]:
        return [round(s * 1e6) for s in seconds]

    return CycleColumns(
        t0=t0, index=[c.index for c in records], kind=[c.kind for c in records],
        start_us=us([c.wall_time - t0 for c in records]),
        engine_us=us([c.engine_s for c in records]), io_us=us([c.io_s for c in records]),
        train_us=us([c.train_s for c in records]), optim_us=us([c.optim_s for c in records]),
        idle_us=us([c.idle_s for c in records]),
        max_wait_us=us([c.max_wait_s for c in records]),
        num_tokens=[c.num_tokens for c in records], num_ops=[c.num_ops for c in records],
        num_models=[c.num_models for c in records],
        num_running=[c.num_running for c in records],
        num_tenants=[len(c.tenants) for c in records],
        tenants=[[names.setdefault(t, len(names)) for t in visible_tenants(c, viewer)]
                 for c in records])
