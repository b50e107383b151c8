"""Opens everything persistent under one data dir: the SQLite database, every noun store, the
checkpoint and archive directories, and the server's URL-signing secret.

Layout::

    <data_dir>/loraplex.sqlite3   metadata (WAL); names checkpoint directories relative to
                                  checkpoints/, so the data dir may be renamed, moved or copied
    <data_dir>/checkpoints/       checkpoint directories (written by the executor)
    <data_dir>/quarantine/        directories startup found no record for (never deleted)
    <data_dir>/archives/          cached tar archives (0.27 download path)
    <data_dir>/server_secret      32 random bytes signing download URLs (mode 0600)

Opening refuses a data dir whose database is missing or empty while checkpoint directories
exist (a lost or misplaced database), rather than starting a server that knows none of them.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

from loraplex.errors import StorageError
from loraplex.store import (
    checkpoints,
    custom_losses,
    eval_scores,
    futures,
    keys,
    run_metrics,
    runs,
    samplers,
    sequences,
    served_models,
    sessions,
    usage,
)
from loraplex.store.checkpoint_paths import directories_on_disk
from loraplex.store.db import Database
from loraplex.store.disk import storage_error

DATABASE_FILE = "loraplex.sqlite3"
SCHEMAS = (keys.SCHEMA, sessions.SCHEMA, runs.SCHEMA, checkpoints.SCHEMA, samplers.SCHEMA,
           sequences.SCHEMA, futures.SCHEMA, served_models.SCHEMA, usage.SCHEMA,
           run_metrics.SCHEMA, custom_losses.SCHEMA, eval_scores.SCHEMA)


@dataclass(frozen=True)
class Stores:
    db: Database
    keys: keys.KeyStore
    sessions: sessions.SessionStore
    runs: runs.RunStore
    checkpoints: checkpoints.CheckpointStore
    samplers: samplers.SamplerStore
    sequences: sequences.SequenceStore
    futures: futures.FutureJournal
    served_models: served_models.ServedModelStore
    usage: usage.UsageStore
    run_metrics: run_metrics.RunMetricsStore
    archive_dir: str
    custom_losses: custom_losses.CustomLossStore
    eval_scores: eval_scores.EvalScoreStore
    secret: bytes

    def close(self) -> None:
        self.futures.close()
        self.db.close()


def open_stores(data_dir: str) -> Stores:
    """Open (creating if needed) the stores of ``data_dir``.

    Raises:
        StorageError: the data dir cannot be written (read-only, full), its database is
            damaged, or the database is missing or empty beside existing checkpoints.
    """
    try:
        return _open(data_dir)
    except OSError as exc:
        raise storage_error(exc, _existing_parent(data_dir)) from exc


def _open(data_dir: str) -> Stores:
    os.makedirs(data_dir, exist_ok=True)
    db_path = os.path.join(data_dir, DATABASE_FILE)
    checkpoint_root = os.path.join(data_dir, "checkpoints")
    if not os.path.exists(db_path):
        _refuse_orphaned_checkpoints(data_dir, checkpoint_root, "is missing")
    db = Database(db_path, SCHEMAS)
    try:
        if _is_empty(db):
            _refuse_orphaned_checkpoints(data_dir, checkpoint_root,
                                        "has no training runs or checkpoints")
        return Stores(
            db=db,
            keys=keys.KeyStore(db),
            sessions=sessions.SessionStore(db),
            runs=runs.RunStore(db),
            checkpoints=checkpoints.CheckpointStore(db, checkpoint_root,
                                                    os.path.join(data_dir, "quarantine")),
            samplers=samplers.SamplerStore(db),
            sequences=sequences.SequenceStore(db),
            futures=futures.FutureJournal(db),
            served_models=served_models.ServedModelStore(db),
            usage=usage.UsageStore(db),
            run_metrics=run_metrics.RunMetricsStore(db),
            archive_dir=os.path.join(data_dir, "archives"),
            custom_losses=custom_losses.CustomLossStore(db),
            eval_scores=eval_scores.EvalScoreStore(db),
            secret=_load_or_create_secret(os.path.join(data_dir, "server_secret")),
        )
    except BaseException:
        db.close()
        raise


def _is_empty(db: Database) -> bool:
    row = db.query_one("SELECT EXISTS (SELECT 1 FROM training_runs)"
                       " OR EXISTS (SELECT 1 FROM checkpoints) AS used")
    return row is None or not row["used"]


def _refuse_orphaned_checkpoints(data_dir: str, checkpoint_root: str, state: str) -> None:
    """Refuse to start beside checkpoint directories a missing or empty database cannot know:
    the server would list none of them (and an older version deleted them all)."""
    found = directories_on_disk(checkpoint_root)
    if not found:
        return
    raise StorageError(
        f"refusing to start: the data dir {data_dir} holds {len(found)} checkpoint "
        f"directories but its database {DATABASE_FILE} {state}, so none of them would be "
        f"known. If --data-dir names the wrong directory, fix it; otherwise restore "
        f"{DATABASE_FILE} (with its -wal file) from a backup, or move the checkpoints "
        f"directory aside (for example to checkpoints.orphaned) to start with none. "
        f"Nothing was changed.")


def _existing_parent(path: str) -> str:
    """``path`` or its nearest existing ancestor (for the free-space figure of an error)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _load_or_create_secret(path: str) -> bytes:
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    value = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(value)
    return value
