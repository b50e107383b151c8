"""The futures journal: which request ids exist, whose they are, and how they ended.

Results themselves live in memory (`loraplex.scheduler.futures`); the journal lets the server
answer a poll for a request that a restart interrupted or whose result was dropped with a clear
failure instead of an unknown-id 404. Writes are buffered and flushed by a background thread
every ``flush_interval_s`` (and on `find` and `close`), so no request pays for a SQLite write;
a crash can lose the last interval's entries, which then answer 404 like unknown ids.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Literal

from loraplex.store.db import Database

JournalState = Literal["pending", "done", "failed"]
log = logging.getLogger("loraplex.store")

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
    def __init__(self, db: Database, flush_interval_s: float = 0.2) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._submitted: list[tuple[str, str, str, float]] = []
        self._completed: list[tuple[str, str | None, str | None, float, str]] = []
        self._stop = threading.Event()
        self._interval = flush_interval_s
        self._thread = threading.Thread(target=self._flush_loop, name="loraplex-journal",
                                        daemon=True)
        self._thread.start()

    def submitted(self, request_id: str, tenant: str, kind: str) -> None:
        with self._lock:
            self._submitted.append((request_id, tenant, kind, time.time()))

    def completed(self, request_id: str, error: str | None, category: str | None) -> None:
        state = "done" if error is None else "failed"
        with self._lock:
            self._completed.append((state, error, category, time.time(), request_id))

    def flush(self) -> None:
        with self._lock:
            submitted, self._submitted = self._submitted, []
            completed, self._completed = self._completed, []
        if not submitted and not completed:
            return
        with self._db.transaction() as conn:
            conn.executemany("INSERT OR IGNORE INTO futures (request_id, tenant, kind, state,"
                             " created_at) VALUES (?,?,?,'pending',?)", submitted)
            conn.executemany("UPDATE futures SET state = ?, error = ?, category = ?,"
                             " completed_at = ? WHERE request_id = ?", completed)

    def find(self, request_id: str) -> JournalEntry | None:
        self.flush()
        row = self._db.query_one("SELECT * FROM futures WHERE request_id = ?", (request_id,))
        if row is None:
            return None
        return JournalEntry(row["request_id"], row["tenant"], row["kind"], row["state"],
                            row["error"], row["category"])

    def expire(self, older_than: float) -> int:
        self.flush()
        return self._db.execute("DELETE FROM futures WHERE created_at < ?", (older_than,))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.flush()

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception:
                if self._stop.is_set():  # the database is closing; close() flushes last
                    return
                log.exception("futures journal flush failed; will retry")
