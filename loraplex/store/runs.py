"""Training runs (= Tinker model ids ``{session_id}:train:{n}``): owner, base model, LoRA config,
user metadata and counters. The live adapter itself is engine memory; this is its record.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from loraplex.domain.lora import LoraConfig
from loraplex.domain.training_run import TrainingRun
from loraplex.errors import NotFoundError
from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS training_runs (
    model_id           TEXT PRIMARY KEY,
    tenant             TEXT NOT NULL,
    session_id         TEXT NOT NULL,
    base_model         TEXT NOT NULL,
    lora_config        TEXT NOT NULL,
    optimizer_config   TEXT NOT NULL,
    user_metadata      TEXT NOT NULL,
    created_at         REAL NOT NULL,
    last_request_time  REAL NOT NULL,
    num_steps          INTEGER NOT NULL DEFAULT 0,
    num_trained_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_tenant ON training_runs (tenant, created_at);
CREATE INDEX IF NOT EXISTS runs_by_session ON training_runs (session_id);
"""


@dataclass(frozen=True)
class TrainingRunRecord:
    """One stored training run: its fixed facts and what happened to it since.

    Attributes:
        run: what it was created with (create_model, or create-via-load with the checkpoint's
            LoRA config).
        num_steps, num_trained_tokens: optim steps applied and datum tokens trained on.
    """

    run: TrainingRun
    created_at: float
    last_request_time: float
    num_steps: int
    num_trained_tokens: int


class RunStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._identities: dict[str, TrainingRun] = {}
        self._lock = threading.Lock()

    def identity(self, model_id: str, tenant: str, field: str = "model_id") -> TrainingRun:
        """The tenant's run (its fixed facts, cached: the hot path reads them on every
        training request); unknown / foreign ids raise NotFoundError."""
        with self._lock:
            cached = self._identities.get(model_id)
        if cached is None:
            record = self.find(model_id)
            if record is not None:
                cached = record.run
                with self._lock:
                    self._identities[model_id] = cached
        if cached is None or cached.tenant != tenant:
            raise NotFoundError(f"{field}: no training run {model_id!r}", field=field)
        return cached

    def insert(self, run: TrainingRun) -> None:
        """Record a run that just came to life (its counters start at zero)."""
        now = time.time()
        self._db.execute(
            "INSERT OR REPLACE INTO training_runs (model_id, tenant, session_id, base_model,"
            " lora_config, optimizer_config, user_metadata, created_at, last_request_time)"
            " VALUES (?,?,?,?,?,?,?,?,?)",
            (run.model_id, run.tenant, run.session_id, run.base_model,
             json.dumps(_lora_json(run.lora)), json.dumps(dict(run.optimizer_config)),
             json.dumps(dict(run.user_metadata)), now, now),
        )

    def find(self, model_id: str) -> TrainingRunRecord | None:
        row = self._db.query_one("SELECT * FROM training_runs WHERE model_id = ?", (model_id,))
        return None if row is None else _record(row)

    def get(self, model_id: str, tenant: str, field: str = "model_id") -> TrainingRunRecord:
        """The tenant's run; an unknown or another tenant's id raises NotFoundError."""
        record = self.find(model_id)
        if record is None or record.run.tenant != tenant:
            raise NotFoundError(f"{field}: no training run {model_id!r}", field=field)
        return record

    def record_step(self, model_id: str, num_tokens: int) -> None:
        self._db.execute(
            "UPDATE training_runs SET num_steps = num_steps + 1,"
            " num_trained_tokens = num_trained_tokens + ?, last_request_time = ?"
            " WHERE model_id = ?",
            (num_tokens, time.time(), model_id),
        )

    def touch(self, model_id: str) -> None:
        self._db.execute("UPDATE training_runs SET last_request_time = ? WHERE model_id = ?",
                         (time.time(), model_id))

    def page(
        self, tenant: str, *, include_public: bool, limit: int, offset: int
    ) -> tuple[list[TrainingRunRecord], int]:
        """The tenant's runs (plus runs with a published checkpoint), newest first."""
        where = "tenant = ?"
        if include_public:
            where += (" OR model_id IN (SELECT run_id FROM checkpoints"
                      " WHERE public = 1 AND state = 'ready')")
        rows = self._db.query(
            f"SELECT * FROM training_runs WHERE {where} ORDER BY created_at DESC LIMIT ? OFFSET ?",
            (tenant, limit, offset),
        )
        total = self._db.query_one(f"SELECT COUNT(*) AS n FROM training_runs WHERE {where}",
                                   (tenant,))
        return [_record(r) for r in rows], int(total["n"]) if total else 0

    def for_session(self, session_id: str) -> list[TrainingRunRecord]:
        rows = self._db.query("SELECT * FROM training_runs WHERE session_id = ? ORDER BY"
                              " created_at", (session_id,))
        return [_record(r) for r in rows]


def _lora_json(lora: LoraConfig) -> dict[str, Any]:
    return {"rank": lora.rank, "alpha": lora.alpha, "train_attn": lora.train_attn,
            "train_mlp": lora.train_mlp, "train_unembed": lora.train_unembed, "seed": lora.seed}


def _record(row: Any) -> TrainingRunRecord:
    run = TrainingRun(
        model_id=row["model_id"], tenant=row["tenant"], session_id=row["session_id"],
        base_model=row["base_model"], lora=LoraConfig(**json.loads(row["lora_config"])),
        optimizer_config=json.loads(row["optimizer_config"]),
        user_metadata=json.loads(row["user_metadata"]))
    return TrainingRunRecord(run, created_at=row["created_at"],
                             last_request_time=row["last_request_time"],
                             num_steps=row["num_steps"],
                             num_trained_tokens=row["num_trained_tokens"])
