"""Opens everything persistent under one data dir: the SQLite database, every noun store, the
checkpoint and archive directories, and the server's URL-signing secret.

Layout::

    <data_dir>/loraplex.sqlite3   metadata (WAL)
    <data_dir>/checkpoints/       checkpoint directories (written by the executor)
    <data_dir>/archives/          cached tar archives (0.27 download path)
    <data_dir>/server_secret      32 random bytes signing download URLs (mode 0600)
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

from loraplex.store import (
    checkpoints,
    futures,
    keys,
    runs,
    samplers,
    sequences,
    served_models,
    sessions,
    usage,
)
from loraplex.store.db import Database

SCHEMAS = (keys.SCHEMA, sessions.SCHEMA, runs.SCHEMA, checkpoints.SCHEMA, samplers.SCHEMA,
           sequences.SCHEMA, futures.SCHEMA, served_models.SCHEMA, usage.SCHEMA)


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
    archive_dir: str
    secret: bytes

    def close(self) -> None:
        self.futures.close()
        self.db.close()


def open_stores(data_dir: str) -> Stores:
    """Open (creating if needed) the stores of ``data_dir``."""
    os.makedirs(data_dir, exist_ok=True)
    db = Database(os.path.join(data_dir, "loraplex.sqlite3"), SCHEMAS)
    return Stores(
        db=db,
        keys=keys.KeyStore(db),
        sessions=sessions.SessionStore(db),
        runs=runs.RunStore(db),
        checkpoints=checkpoints.CheckpointStore(db, os.path.join(data_dir, "checkpoints")),
        samplers=samplers.SamplerStore(db),
        sequences=sequences.SequenceStore(db),
        futures=futures.FutureJournal(db),
        served_models=served_models.ServedModelStore(db),
        usage=usage.UsageStore(db),
        archive_dir=os.path.join(data_dir, "archives"),
        secret=_load_or_create_secret(os.path.join(data_dir, "server_secret")),
    )


def _load_or_create_secret(path: str) -> bytes:
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    value = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(value)
    return value
