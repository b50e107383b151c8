"""Metered usage: counters per (tenant, training run, served model, op kind, hour), summed.

The server folds finished ops into deltas in memory and adds them here in one transaction every
few seconds (`UsageStore.add` upserts ``counter = counter + delta``), so no request pays for a
SQLite write and the table grows with runs × kinds × hours, not with ops. Raw quantities only;
pricing them is the reader's business (``loraplex.cost.billing``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, fields

from loraplex.domain.usage import USAGE_COUNTERS, UsageCounts, UsageKey
from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    tenant                TEXT NOT NULL,
    run_id                TEXT NOT NULL,
    base_model            TEXT NOT NULL,
    kind                  TEXT NOT NULL,
    hour                  INTEGER NOT NULL,
    num_ops               INTEGER NOT NULL DEFAULT 0,
    num_failed            INTEGER NOT NULL DEFAULT 0,
    engine_s              REAL NOT NULL DEFAULT 0,
    trained_tokens        INTEGER NOT NULL DEFAULT 0,
    forward_tokens        INTEGER NOT NULL DEFAULT 0,
    prompt_tokens         INTEGER NOT NULL DEFAULT 0,
    rollout_prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cache_hit_tokens      INTEGER NOT NULL DEFAULT 0,
    sampled_tokens        INTEGER NOT NULL DEFAULT 0,
    num_sequences         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, run_id, base_model, kind, hour)
);
"""


COUNTERS = USAGE_COUNTERS
_KEYS = tuple(f.name for f in fields(UsageKey))


class UsageStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def add(self, deltas: Mapping[UsageKey, UsageCounts]) -> None:
        """Add ``deltas`` to the stored counters, all in one transaction."""
        if not deltas:
            return
        columns = ", ".join(_KEYS + COUNTERS)
        marks = ", ".join("?" * (len(_KEYS) + len(COUNTERS)))
        updates = ", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTERS)
        sql = (f"INSERT INTO usage ({columns}) VALUES ({marks}) "
               f"ON CONFLICT ({', '.join(_KEYS)}) DO UPDATE SET {updates}")
        rows = [astuple(key) + astuple(counts) for key, counts in deltas.items()]
        with self._db.transaction() as conn:
            conn.executemany(sql, rows)

    def rows(self, tenant: str | None = None, since: float | None = None
             ) -> list[tuple[UsageKey, UsageCounts]]:
        """Stored rows, optionally of one tenant and from the hour containing ``since`` on."""
        where: list[str] = []
        params: list[str | int] = []
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        if since is not None:
            where.append("hour >= ?")
            params.append(int(since) // 3600 * 3600)
        sql = "SELECT * FROM usage" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY tenant, run_id, base_model, kind, hour"
        return [(UsageKey(*(r[k] for k in _KEYS)), UsageCounts(*(r[c] for c in COUNTERS)))
                for r in self._db.query(sql, params)]
