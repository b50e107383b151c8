"""Sampling sessions (``{session_id}:sample:{n}``): which weights a SamplingClient samples from.

A sampler is bound to the bare base model, to a checkpoint directory, or to an in-memory
snapshot of a training run (``snapshot`` frozen, ``inflight`` following later inflight saves).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from loraplex.errors import CapacityError, NotFoundError
from loraplex.store.db import Database

SamplerSource = Literal["base", "checkpoint", "snapshot", "inflight"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS samplers (
    sampler_id  TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    base_model  TEXT NOT NULL,
    model_path  TEXT,
    source      TEXT NOT NULL,
    model_id    TEXT,
    adapter_id  TEXT,
    adapter_dir TEXT,
    created_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS samplers_by_session ON samplers (session_id);
CREATE INDEX IF NOT EXISTS samplers_by_tenant ON samplers (tenant, created_at);

CREATE TABLE IF NOT EXISTS sampler_clones (
    sampler_id  TEXT PRIMARY KEY,
    last_clone  INTEGER NOT NULL
);
"""

MAX_CLONE_ID = 999_999_999
"""A clone's seq ids start at clone × 10⁹ (the SDK's layout), so ids stay below 2⁶³."""


@dataclass(frozen=True)
class SamplerRecord:
    """One sampling session.

    Attributes:
        base_model: the served NAME (echoed by ``GET /samplers/{id}``).
        model_path: the ``tinker://`` path it was created from, if any.
        source: what ``adapter_id`` refers to.
        model_id: the training run behind a snapshot / inflight sampler.
        adapter_id: engine adapter version to sample with (None: bare base model).
        adapter_dir: where the engine loads ``adapter_id`` from when it is not resident.
    """

    sampler_id: str
    tenant: str
    session_id: str
    base_model: str
    model_path: str | None
    source: SamplerSource
    model_id: str | None
    adapter_id: str | None
    adapter_dir: str | None
    created_at: float


class SamplerStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def insert(self, record: SamplerRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO samplers (sampler_id, tenant, session_id, base_model,"
            " model_path, source, model_id, adapter_id, adapter_dir, created_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?)",
            (record.sampler_id, record.tenant, record.session_id, record.base_model,
             record.model_path, record.source, record.model_id, record.adapter_id,
             record.adapter_dir, record.created_at),
        )

    def find(self, sampler_id: str) -> SamplerRecord | None:
        row = self._db.query_one("SELECT * FROM samplers WHERE sampler_id = ?", (sampler_id,))
        return None if row is None else _record(row)

    def get(self, sampler_id: str, tenant: str, field: str = "sampling_session_id"
            ) -> SamplerRecord:
        record = self.find(sampler_id)
        if record is None or record.tenant != tenant:
            raise NotFoundError(f"{field}: no sampling session {sampler_id!r}", field=field)
        return record

    def page(self, tenant: str, limit: int, offset: int) -> tuple[list[SamplerRecord], int]:
        """The tenant's sampling sessions, newest first, and how many it has."""
        rows = self._db.query("SELECT * FROM samplers WHERE tenant = ? ORDER BY created_at DESC"
                              " LIMIT ? OFFSET ?", (tenant, limit, offset))
        total = self._db.query_one("SELECT COUNT(*) AS n FROM samplers WHERE tenant = ?",
                                   (tenant,))
        return [_record(r) for r in rows], int(total["n"]) if total else 0

    def next_clone(self, sampler_id: str) -> int:
        """A new clone id of the sampler (1, 2, …; the original client is 0), unique across
        restarts (``join_sampling_session``).

        Raises:
            CapacityError: the sampler has had `MAX_CLONE_ID` clones.
        """
        with self._db.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO sampler_clones (sampler_id, last_clone)"
                         " VALUES (?, 0)", (sampler_id,))
            conn.execute("UPDATE sampler_clones SET last_clone = last_clone + 1"
                         " WHERE sampler_id = ?", (sampler_id,))
            row = conn.execute("SELECT last_clone FROM sampler_clones WHERE sampler_id = ?",
                               (sampler_id,)).fetchone()
        clone = int(row[0])
        if clone > MAX_CLONE_ID:
            raise CapacityError(f"sampling session {sampler_id!r} has had {MAX_CLONE_ID} "
                                "clients; create a new one")
        return clone

    def for_session(self, session_id: str) -> list[SamplerRecord]:
        rows = self._db.query("SELECT * FROM samplers WHERE session_id = ? ORDER BY created_at",
                              (session_id,))
        return [_record(r) for r in rows]


def new_record(**fields: Any) -> SamplerRecord:
    return SamplerRecord(created_at=time.time(), **fields)


def _record(row: Any) -> SamplerRecord:
    return SamplerRecord(
        row["sampler_id"], row["tenant"], row["session_id"], row["base_model"],
        row["model_path"], row["source"], row["model_id"], row["adapter_id"],
        row["adapter_dir"], row["created_at"],
    )
