"""Which catalogue NAMEs the server was last started with, and the directories behind them.

Written by ``loraplex serve`` at startup; read by ``loraplex model cache-tokenizer NAME`` so the
tokenizer installed into the client's HF cache is the one the server actually serves.
"""

from __future__ import annotations

import time

from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS served_models (
    name       TEXT PRIMARY KEY,
    source     TEXT NOT NULL,
    model_dir  TEXT NOT NULL,
    updated_at REAL NOT NULL
);
"""


class ServedModelStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def record(self, name: str, source: str, model_dir: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO served_models VALUES (?,?,?,?)",
                         (name, source, model_dir, time.time()))

    def model_dir(self, name: str) -> str | None:
        row = self._db.query_one("SELECT model_dir FROM served_models WHERE name = ?", (name,))
        return None if row is None else str(row["model_dir"])
