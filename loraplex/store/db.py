"""The SQLite database under the data dir: one WAL-mode connection shared by every store.

Owns the connection, the pragmas and transactions; each noun store (keys, sessions, runs,
checkpoints, samplers, sequences, futures) declares its own table DDL and gets this object.
Access is serialised by one lock so the HTTP event loop and the clock-loop thread can share it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class Database:
    """A thread-safe SQLite connection in WAL mode.

    Args:
        path: database file (``:memory:`` for tests).
        schemas: ``CREATE TABLE IF NOT EXISTS`` scripts, run once at open.
    """

    def __init__(self, path: str, schemas: Sequence[str] = ()) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable across application crashes in WAL mode; only an OS crash can lose
        # the last transactions, which is the usual trade for a metadata store.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        for script in schemas:
            self._conn.executescript(script)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Run several statements atomically (BEGIN IMMEDIATE … COMMIT, ROLLBACK on error)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement in autocommit mode; returns the number of rows changed."""
        with self._lock:
            return self._conn.execute(sql, params).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            row: sqlite3.Row | None = self._conn.execute(sql, params).fetchone()
            return row

    def close(self) -> None:
        with self._lock:
            self._conn.close()
