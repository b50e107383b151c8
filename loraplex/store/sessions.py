"""Client sessions (one per ServiceClient): owner, metadata, heartbeats, and whether finished.

Session ids are uuid4 strings (no ``/``: they appear in URLs and in ``{sid}:train:{n}`` ids).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.errors import NotFoundError, user_error
from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id     TEXT PRIMARY KEY,
    tenant         TEXT NOT NULL,
    tags           TEXT NOT NULL,
    user_metadata  TEXT NOT NULL,
    sdk_version    TEXT,
    project_id     TEXT,
    display_name   TEXT,
    created_at     REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    finished_at    REAL,
    finish_reason  TEXT
);
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions (tenant, created_at);
"""


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    tenant: str
    tags: tuple[str, ...]
    user_metadata: Mapping[str, Any]
    sdk_version: str | None
    project_id: str | None
    display_name: str | None
    created_at: float
    last_heartbeat: float
    finished_at: float | None


class SessionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def create(
        self,
        tenant: str,
        *,
        tags: list[str],
        user_metadata: Mapping[str, Any],
        sdk_version: str | None,
        project_id: str | None = None,
        display_name: str | None = None,
    ) -> SessionRecord:
        now = time.time()
        record = SessionRecord(
            str(uuid.uuid4()), tenant, tuple(tags), dict(user_metadata), sdk_version,
            project_id, display_name, now, now, None,
        )
        self._db.execute(
            "INSERT INTO sessions (session_id, tenant, tags, user_metadata, sdk_version,"
            " project_id, display_name, created_at, last_heartbeat) VALUES (?,?,?,?,?,?,?,?,?)",
            (record.session_id, tenant, json.dumps(list(tags)), json.dumps(dict(user_metadata)),
             sdk_version, project_id, display_name, now, now),
        )
        return record

    def get(self, session_id: str, tenant: str) -> SessionRecord:
        """The tenant's session; another tenant's or an unknown id raise NotFoundError."""
        row = self._db.query_one("SELECT * FROM sessions WHERE session_id = ?", (session_id,))
        if row is None or row["tenant"] != tenant:
            raise NotFoundError(f"session_id: no session {session_id!r}", field="session_id")
        return _record(row)

    def get_open(self, session_id: str, tenant: str) -> SessionRecord:
        """The tenant's session, which must not be finished (a finished session is terminal:
        nothing new may be created in it)."""
        record = self.get(session_id, tenant)
        if record.finished_at is not None:
            raise user_error("session_id", f"session {session_id!r} was finished; create a "
                             "new ServiceClient")
        return record

    def heartbeat(self, session_id: str, tenant: str) -> None:
        changed = self._db.execute(
            "UPDATE sessions SET last_heartbeat = ? WHERE session_id = ? AND tenant = ?",
            (time.time(), session_id, tenant),
        )
        if not changed:
            raise NotFoundError(f"session_id: no session {session_id!r}", field="session_id")

    def finish(self, session_id: str, tenant: str, reason: str) -> None:
        self.get(session_id, tenant)
        self._db.execute(
            "UPDATE sessions SET finished_at = ?, finish_reason = ? WHERE session_id = ?",
            (time.time(), reason, session_id),
        )

    def page(self, tenant: str, limit: int, offset: int) -> tuple[list[SessionRecord], int]:
        rows = self._db.query(
            "SELECT * FROM sessions WHERE tenant = ? ORDER BY created_at DESC LIMIT ? OFFSET ?",
            (tenant, limit, offset),
        )
        total = self._db.query_one("SELECT COUNT(*) AS n FROM sessions WHERE tenant = ?",
                                   (tenant,))
        return [_record(r) for r in rows], int(total["n"]) if total else 0

    def idle(self, older_than: float) -> list[SessionRecord]:
        """Unfinished sessions whose last heartbeat is before ``older_than`` (epoch seconds)."""
        rows = self._db.query(
            "SELECT * FROM sessions WHERE finished_at IS NULL AND last_heartbeat < ?",
            (older_than,),
        )
        return [_record(r) for r in rows]


def _record(row: Any) -> SessionRecord:
    return SessionRecord(
        row["session_id"], row["tenant"], tuple(json.loads(row["tags"])),
        json.loads(row["user_metadata"]), row["sdk_version"], row["project_id"],
        row["display_name"], row["created_at"], row["last_heartbeat"], row["finished_at"],
    )
