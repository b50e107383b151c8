"""The futures journal: which request ids exist, whose they are, and how they ended.

Results themselves live in memory (`loraplex.scheduler.futures`); the journal lets the server
answer a poll for a request that a restart interrupted or whose result was dropped with a clear
failure instead of an unknown-id 404.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from loraplex.store.db import Database

JournalState = Literal["pending", "done", "failed"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS futures (
    request_id   TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    kind         TEXT NOT NULL,
    state        TEXT NOT NULL,
    error        TEXT,
    category     TEXT,
    created_at   REAL NOT NULL,
    completed_at REAL
);
CREATE INDEX IF NOT EXISTS futures_by_created ON futures (created_at);
"""


@dataclass(frozen=True)
class JournalEntry:
    request_id: str
    tenant: str
    kind: str
    state: JournalState
    error: str | None
    category: str | None


class FutureJournal:
    def __init__(self, db: Database) -> None:
        self._db = db

    def submitted(self, request_id: str, tenant: str, kind: str) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO futures (request_id, tenant, kind, state, created_at)"
            " VALUES (?,?,?,'pending',?)", (request_id, tenant, kind, time.time()),
        )

    def completed(self, request_id: str, error: str | None, category: str | None) -> None:
        self._db.execute(
            "UPDATE futures SET state = ?, error = ?, category = ?, completed_at = ?"
            " WHERE request_id = ?",
            ("done" if error is None else "failed", error, category, time.time(), request_id),
        )

    def find(self, request_id: str) -> JournalEntry | None:
        row = self._db.query_one("SELECT * FROM futures WHERE request_id = ?", (request_id,))
        if row is None:
            return None
        return JournalEntry(row["request_id"], row["tenant"], row["kind"], row["state"],
                            row["error"], row["category"])

    def expire(self, older_than: float) -> int:
        return self._db.execute("DELETE FROM futures WHERE created_at < ?", (older_than,))
