"""Evaluation scores stored with the checkpoint they were measured on (`EvalScore` rows keyed by
checkpoint path, task and metric; a later run of the same task replaces its rows, and a
trigger drops them with the checkpoint's row, deleted or expired). Knows nothing of lm-eval or
of who may read a checkpoint."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from loraplex.domain.eval_score import EvalScore
from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS eval_scores (
    path        TEXT NOT NULL,
    task        TEXT NOT NULL,
    metric      TEXT NOT NULL,
    value       REAL NOT NULL,
    stderr      REAL,
    num_samples INTEGER,
    created_at  REAL NOT NULL,
    PRIMARY KEY (path, task, metric)
);
CREATE TRIGGER IF NOT EXISTS eval_scores_follow_checkpoints AFTER DELETE ON checkpoints
BEGIN
    DELETE FROM eval_scores WHERE path = 'tinker://' || OLD.run_id || '/' || OLD.checkpoint_id;
END;
"""


class EvalScoreStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def put(self, path: str, scores: Sequence[EvalScore]) -> list[EvalScore]:
        """Store ``scores`` for the checkpoint at ``path``; returns them as stored."""
        now = time.time()
        stored = []
        for s in scores:
            self._db.execute(
                "INSERT OR REPLACE INTO eval_scores (path, task, metric, value, stderr,"
                " num_samples, created_at) VALUES (?,?,?,?,?,?,?)",
                (path, s.task, s.metric, s.value, s.stderr, s.num_samples, now))
            stored.append(EvalScore(s.task, s.metric, s.value, s.stderr, s.num_samples, now))
        return stored

    def list_for(self, paths: Sequence[str]) -> dict[str, list[EvalScore]]:
        """Every stored score of each path (task, metric order); paths without any: []."""
        out: dict[str, list[EvalScore]] = {p: [] for p in paths}
        if not paths:
            return out
        marks = ",".join("?" * len(paths))
        for row in self._db.query(
                f"SELECT * FROM eval_scores WHERE path IN ({marks}) ORDER BY task, metric",
                tuple(paths)):
            out[row["path"]].append(_score(row))
        return out


def _score(row: Any) -> EvalScore:
    return EvalScore(row["task"], row["metric"], row["value"], row["stderr"],
                     row["num_samples"], row["created_at"])
