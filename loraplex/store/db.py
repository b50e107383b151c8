"""The SQLite database under the data dir: one WAL-mode connection shared by every store.

Owns the connection, the pragmas and transactions; each noun store (keys, sessions, runs,
checkpoints, samplers, sequences, futures) declares its own table DDL and gets this object.
Access is serialised by one lock so the HTTP event loop and the clock-loop thread can share it.
SQLite failures caused by the disk (full, read-only, damaged) surface as `StorageError`; any
other SQLite error (a bad statement, a constraint) keeps its own type.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from loraplex.store.disk import sqlite_storage_error

log = logging.getLogger("loraplex.store")


class Database:
    """A thread-safe SQLite connection in WAL mode.

    Args:
        path: database file (``:memory:`` for tests).
        schemas: ``CREATE TABLE IF NOT EXISTS`` scripts, run once at open.
    """

    def __init__(self, path: str, schemas: Sequence[str] = ()) -> None:
        self.path = path
        self._root = "." if path == ":memory:" else os.path.dirname(os.path.abspath(path))
        self._lock = threading.RLock()
        with self._storage_errors():
            self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            try:
                self._configure(schemas)
            except BaseException:
                self._conn.close()
                raise

    def _configure(self, schemas: Sequence[str]) -> None:
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
        with self._lock, self._storage_errors():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):  # report the first error
                        self._conn.execute("ROLLBACK")
                raise

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement in autocommit mode; returns the number of rows changed."""
        with self._lock, self._storage_errors():
            return self._conn.execute(sql, params).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock, self._storage_errors():
            return self._conn.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._lock, self._storage_errors():
            row: sqlite3.Row | None = self._conn.execute(sql, params).fetchone()
            return row

    @contextmanager
    def _storage_errors(self) -> Iterator[None]:
        """Re-raise a disk-caused SQLite failure as `StorageError` (the path goes to the log)."""
        try:
            yield
        except sqlite3.Error as exc:
            error = sqlite_storage_error(exc, self._root)
            if error is None:
                raise
            log.warning("database %s: %s", self.path, exc)
            raise error from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()
