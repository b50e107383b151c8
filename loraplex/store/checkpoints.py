"""Checkpoint records and their directories: allocation, commit, TTL expiry, publishing.

A save allocates a fresh directory (``<root>/<run_id>/<kind>/<name>.<token>``) that the executor
creates atomically; only `commit` makes it visible, replacing (and deleting) an older checkpoint
of the same name. Directories no record points at (a crash between write and commit) are swept
at startup. A checkpoint is readable by its owner, and by everyone once published.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.domain.checkpoint import ReservedCheckpoint
from loraplex.domain.ids import TinkerPath, validate_checkpoint_name
from loraplex.errors import ConflictError, NotFoundError
from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id        TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    directory     TEXT NOT NULL,
    size_bytes    INTEGER NOT NULL,
    created_at    REAL NOT NULL,
    expires_at    REAL,
    public        INTEGER NOT NULL DEFAULT 0,
    user_metadata TEXT NOT NULL,
    state         TEXT NOT NULL DEFAULT 'ready',
    PRIMARY KEY (run_id, checkpoint_id)
);
CREATE INDEX IF NOT EXISTS checkpoints_by_tenant ON checkpoints (tenant, created_at);
CREATE INDEX IF NOT EXISTS checkpoints_by_expiry ON checkpoints (expires_at);
"""


@dataclass(frozen=True)
class CheckpointRecord:
    path: TinkerPath
    tenant: str
    directory: str
    size_bytes: int
    created_at: float
    expires_at: float | None
    public: bool
    user_metadata: Mapping[str, str]

    def readable_by(self, tenant: str) -> bool:
        return self.public or self.tenant == tenant


class CheckpointStore:
    """Checkpoint metadata in SQLite, files under ``root``."""

    def __init__(self, db: Database, root: str) -> None:
        self._db = db
        self.root = root
        os.makedirs(root, exist_ok=True)
        self._reserved: set[str] = set()
        self._lock = threading.Lock()

    def allocate(
        self,
        path: TinkerPath,
        tenant: str,
        *,
        ttl_seconds: int | None,
        overwrite: bool,
        user_metadata: Mapping[str, str] | None = None,
    ) -> ReservedCheckpoint:
        """Reserve a fresh directory for a save of ``path``.

        Raises:
            ConflictError: a checkpoint of that name exists (without ``overwrite``), or another
                save of the same name is still queued.
        """
        validate_checkpoint_name(path.name)
        key = str(path)
        with self._lock:
            if key in self._reserved:
                raise ConflictError(f"path: a save of {key} is already in progress", field="path")
            if not overwrite and self.find(path) is not None:
                raise ConflictError(
                    f"path: checkpoint {key} already exists; pass overwrite=True to replace it",
                    field="path",
                )
            self._reserved.add(key)
        parent = os.path.join(self.root, path.run_id, path.kind)
        os.makedirs(parent, exist_ok=True)
        directory = os.path.join(parent, f"{path.name}.{secrets.token_hex(4)}")
        return ReservedCheckpoint(path, tenant, directory, ttl_seconds, dict(user_metadata or {}))

    def commit(self, pending: ReservedCheckpoint) -> CheckpointRecord:
        """Publish a written checkpoint, replacing an older one of the same name."""
        now = time.time()
        size = directory_size(pending.directory)
        expires = None if pending.ttl_seconds is None else now + pending.ttl_seconds
        old = self.find(pending.path)
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, checkpoint_id, tenant, directory,"
                " size_bytes, created_at, expires_at, public, user_metadata, state)"
                " VALUES (?,?,?,?,?,?,?,0,?,'ready')",
                (pending.path.run_id, pending.path.checkpoint_id, pending.tenant,
                 pending.directory, size, now, expires, json.dumps(dict(pending.user_metadata))),
            )
        self._release(pending)
        if old is not None and old.directory != pending.directory:
            shutil.rmtree(old.directory, ignore_errors=True)
        record = self.find(pending.path)
        assert record is not None
        return record

    def abort(self, pending: ReservedCheckpoint) -> None:
        """Forget a failed save and remove whatever it wrote."""
        self._release(pending)
        shutil.rmtree(pending.directory, ignore_errors=True)

    def find(self, path: TinkerPath) -> CheckpointRecord | None:
        row = self._db.query_one(
            "SELECT * FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?",
            (path.run_id, path.checkpoint_id),
        )
        return None if row is None else _record(row)

    def get_readable(self, path: TinkerPath, tenant: str, field: str = "path") -> CheckpointRecord:
        """A checkpoint the tenant owns or that is published; otherwise NotFoundError."""
        record = self.find(path)
        if record is None or not record.readable_by(tenant):
            raise NotFoundError(f"{field}: no checkpoint {path}", field=field)
        return record

    def get_owned(self, path: TinkerPath, tenant: str, field: str = "path") -> CheckpointRecord:
        record = self.find(path)
        if record is None or record.tenant != tenant:
            raise NotFoundError(f"{field}: no checkpoint {path}", field=field)
        return record

    def list_for_run(self, run_id: str) -> list[CheckpointRecord]:
        rows = self._db.query("SELECT * FROM checkpoints WHERE run_id = ? ORDER BY created_at",
                              (run_id,))
        return [_record(r) for r in rows]

    def list_for_tenant(
        self, tenant: str, limit: int, offset: int
    ) -> tuple[list[CheckpointRecord], int]:
        rows = self._db.query(
            "SELECT * FROM checkpoints WHERE tenant = ? ORDER BY created_at DESC LIMIT ? OFFSET ?",
            (tenant, limit, offset),
        )
        total = self._db.query_one("SELECT COUNT(*) AS n FROM checkpoints WHERE tenant = ?",
                                   (tenant,))
        return [_record(r) for r in rows], int(total["n"]) if total else 0

    def delete(self, record: CheckpointRecord) -> None:
        self._db.execute("DELETE FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?",
                         (record.path.run_id, record.path.checkpoint_id))
        shutil.rmtree(record.directory, ignore_errors=True)

    def set_public(self, record: CheckpointRecord, public: bool) -> None:
        self._db.execute(
            "UPDATE checkpoints SET public = ? WHERE run_id = ? AND checkpoint_id = ?",
            (int(public), record.path.run_id, record.path.checkpoint_id),
        )

    def set_ttl(self, record: CheckpointRecord, ttl_seconds: int | None) -> None:
        expires = None if ttl_seconds is None else time.time() + ttl_seconds
        self._db.execute(
            "UPDATE checkpoints SET expires_at = ? WHERE run_id = ? AND checkpoint_id = ?",
            (expires, record.path.run_id, record.path.checkpoint_id),
        )

    def expire(self, now: float) -> list[TinkerPath]:
        """Delete every checkpoint whose TTL has passed (rows and files)."""
        rows = self._db.query("SELECT * FROM checkpoints WHERE expires_at IS NOT NULL"
                              " AND expires_at <= ?", (now,))
        expired = [_record(r) for r in rows]
        for record in expired:
            self.delete(record)
        return [r.path for r in expired]

    def remove_orphans(self) -> list[str]:
        """Delete checkpoint directories no record points at (interrupted saves)."""
        known = {r["directory"] for r in self._db.query("SELECT directory FROM checkpoints")}
        removed = []
        for run_id in _subdirs(self.root):
            for kind in _subdirs(os.path.join(self.root, run_id)):
                for name in _subdirs(os.path.join(self.root, run_id, kind)):
                    directory = os.path.join(self.root, run_id, kind, name)
                    if directory not in known:
                        shutil.rmtree(directory, ignore_errors=True)
                        removed.append(directory)
        return removed

    def _release(self, pending: ReservedCheckpoint) -> None:
        with self._lock:
            self._reserved.discard(str(pending.path))


def directory_size(directory: str) -> int:
    total = 0
    for base, _, files in os.walk(directory):
        total += sum(os.path.getsize(os.path.join(base, f)) for f in files)
    return total


def _subdirs(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return [d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d))]


def _record(row: Any) -> CheckpointRecord:
    return CheckpointRecord(
        path=TinkerPath.from_checkpoint_id(row["run_id"], row["checkpoint_id"]),
        tenant=row["tenant"], directory=row["directory"], size_bytes=row["size_bytes"],
        created_at=row["created_at"], expires_at=row["expires_at"], public=bool(row["public"]),
        user_metadata=json.loads(row["user_metadata"]),
    )
