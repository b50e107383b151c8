"""Checkpoint records and their directories: allocation, commit, TTL expiry, publishing.

A save allocates a fresh directory (``<root>/<run_id>/<kind>/<name>.<token>``) that the executor
creates atomically; only `commit` makes it visible, replacing (and deleting) an older checkpoint
of the same name. Rows name directories relative to the root and records carry them resolved
under the root this store was opened with (`checkpoint_paths`); rows of older versions are
migrated at open. Directories no record names (a crash between write and commit) are moved to
the quarantine folder at startup, never deleted. A checkpoint is readable by its owner, and by
everyone once published.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.domain.checkpoint import ReservedCheckpoint
from loraplex.domain.ids import TinkerPath, validate_checkpoint_name
from loraplex.errors import ConflictError, LoraplexError, NotFoundError
from loraplex.store import checkpoint_paths as paths
from loraplex.store.db import Database
from loraplex.store.disk import storage_error
from loraplex.store.quarantine import quarantine

log = logging.getLogger("loraplex.store")

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
    """One committed checkpoint.

    Attributes:
        directory: its absolute directory under this data dir's checkpoints root.
    """

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
    """Checkpoint metadata in SQLite, files under ``root``.

    Args:
        root: the checkpoints directory (created if missing; any spelling of it).
        quarantine_dir: where `quarantine_unknown` moves directories no record names
            (default: ``quarantine`` beside ``root``).

    Raises:
        StorageError: ``root`` cannot be created (read-only or full disk).
    """

    def __init__(self, db: Database, root: str, quarantine_dir: str | None = None) -> None:
        self._db = db
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, os.path.dirname(os.path.abspath(root)),
                                "checkpoints") from exc
        self.root = os.path.realpath(root)
        self.quarantine_dir = os.path.realpath(
            quarantine_dir or os.path.join(os.path.dirname(self.root), "quarantine"))
        self._reserved: set[str] = set()
        self._lock = threading.Lock()
        self._migrate_old_rows()

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
            StorageError: its parent directory cannot be created (nothing stays reserved).
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
        directory = os.path.join(self.root,
                                 paths.relative_directory(path, secrets.token_hex(4)))
        try:
            os.makedirs(os.path.dirname(directory), exist_ok=True)
        except OSError as exc:
            self._release_key(key)
            raise self.storage_error(exc) from exc
        return ReservedCheckpoint(path, tenant, directory, ttl_seconds, dict(user_metadata or {}))

    def commit(self, pending: ReservedCheckpoint) -> CheckpointRecord:
        """Publish a written checkpoint, replacing an older one of the same name.

        Raises:
            StorageError: the database cannot be written (full or read-only disk).
        """
        now = time.time()
        relative = os.path.relpath(pending.directory, self.root)
        assert paths.is_relative_row(relative, pending.path), pending.directory
        try:
            size = directory_size(pending.directory)
        except OSError as exc:
            raise self.storage_error(exc) from exc
        expires = None if pending.ttl_seconds is None else now + pending.ttl_seconds
        old = self.find(pending.path)
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, checkpoint_id, tenant, directory,"
                " size_bytes, created_at, expires_at, public, user_metadata, state)"
                " VALUES (?,?,?,?,?,?,?,0,?,'ready')",
                (pending.path.run_id, pending.path.checkpoint_id, pending.tenant,
                 relative, size, now, expires, json.dumps(dict(pending.user_metadata))),
            )
        self._release(pending)
        if old is not None and old.directory != pending.directory:
            paths.remove_tree(self.root, old.directory)
        record = self.find(pending.path)
        assert record is not None
        return record

    def abort(self, pending: ReservedCheckpoint) -> None:
        """Forget a failed save and remove whatever it wrote."""
        self._release(pending)
        paths.remove_tree(self.root, pending.directory)

    def find(self, path: TinkerPath) -> CheckpointRecord | None:
        row = self._db.query_one(
            "SELECT * FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?",
            (path.run_id, path.checkpoint_id),
        )
        return None if row is None else self._record(row)

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
        return [self._record(r) for r in rows]

    def list_for_tenant(
        self, tenant: str, limit: int, offset: int
    ) -> tuple[list[CheckpointRecord], int]:
        rows = self._db.query(
            "SELECT * FROM checkpoints WHERE tenant = ? ORDER BY created_at DESC LIMIT ? OFFSET ?",
            (tenant, limit, offset),
        )
        total = self._db.query_one("SELECT COUNT(*) AS n FROM checkpoints WHERE tenant = ?",
                                   (tenant,))
        return [self._record(r) for r in rows], int(total["n"]) if total else 0

    def bytes_for_tenant(self, tenant: str) -> int:
        """Total ``size_bytes`` of the tenant's committed checkpoints."""
        row = self._db.query_one("SELECT COALESCE(SUM(size_bytes), 0) AS n FROM checkpoints"
                                 " WHERE tenant = ?", (tenant,))
        return int(row["n"]) if row else 0

    def count_for_tenant(self, tenant: str) -> int:
        row = self._db.query_one("SELECT COUNT(*) AS n FROM checkpoints WHERE tenant = ?",
                                 (tenant,))
        return int(row["n"]) if row else 0

    def delete(self, record: CheckpointRecord) -> None:
        """Forget a checkpoint and remove its directory (only ever one under this root)."""
        self._db.execute("DELETE FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?",
                         (record.path.run_id, record.path.checkpoint_id))
        paths.remove_tree(self.root, record.directory)

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
        expired = [self._record(r) for r in rows]
        for record in expired:
            self.delete(record)
        return [r.path for r in expired]

    def quarantine_unknown(self) -> list[str]:
        """Move every directory under the root that no record names (an interrupted save, or
        files the database does not know) to the quarantine folder; returns their layout names.
        Deletes nothing. Run at startup, before any save is in flight."""
        rows = self._db.query("SELECT directory FROM checkpoints")
        known = {os.path.realpath(os.path.join(self.root, r["directory"])) for r in rows}
        unknown = [name for name in paths.directories_on_disk(self.root)
                   if os.path.realpath(os.path.join(self.root, name)) not in known]
        return quarantine(self.root, unknown, self.quarantine_dir)

    def storage_error(self, exc: BaseException) -> LoraplexError:
        """The client-safe error of a failed write under the checkpoints root (an OSError, or
        safetensors' error carrying one): `StorageError` for a full or read-only disk (naming
        the free bytes), else a logged server bug (`disk.storage_error`)."""
        return storage_error(exc, self.root, "checkpoints")

    def _migrate_old_rows(self) -> None:
        """Rewrite rows of older versions (whole paths as spelled then) to layout names under
        this root; a directory not found here is reported, and no other tree is touched."""
        rows = self._db.query("SELECT run_id, checkpoint_id, directory FROM checkpoints")
        updates = []
        for row in rows:
            path = TinkerPath.from_checkpoint_id(row["run_id"], row["checkpoint_id"])
            if paths.is_relative_row(row["directory"], path):
                continue
            relative = paths.relative_of_old_row(row["directory"], path)
            if not os.path.isdir(os.path.join(self.root, relative)):
                log.warning("checkpoint %s: its directory is not in this data dir (the "
                            "database named %s)", path, row["directory"])
            updates.append((relative, row["run_id"], row["checkpoint_id"]))
        if updates:
            with self._db.transaction() as conn:
                conn.executemany("UPDATE checkpoints SET directory = ? WHERE run_id = ?"
                                 " AND checkpoint_id = ?", updates)
            log.info("migrated %d checkpoint rows to paths relative to the data dir",
                     len(updates))

    def _record(self, row: Any) -> CheckpointRecord:
        return CheckpointRecord(
            path=TinkerPath.from_checkpoint_id(row["run_id"], row["checkpoint_id"]),
            tenant=row["tenant"], directory=os.path.join(self.root, row["directory"]),
            size_bytes=row["size_bytes"], created_at=row["created_at"],
            expires_at=row["expires_at"], public=bool(row["public"]),
            user_metadata=json.loads(row["user_metadata"]),
        )

    def _release(self, pending: ReservedCheckpoint) -> None:
        self._release_key(str(pending.path))

    def _release_key(self, key: str) -> None:
        with self._lock:
            self._reserved.discard(key)


def directory_size(directory: str) -> int:
    total = 0
    for base, _, files in os.walk(directory):
        total += sum(os.path.getsize(os.path.join(base, f)) for f in files)
    return total
