"""Training runs' metrics per step, on disk: one row per (run, series, step) and one per metric
key of it, so a curve of any length is read back bucketed by SQL, never loaded whole.

Series ``train``: step n is the run's n-th optim step, holding the forward_backward ops since
step n-1 folded together (`loraplex.domain.step_metrics.fold`) plus the step's own metrics; the
step after the last optim step is *open* while its forward_backward ops arrive. Series
``forward``: forward-only ops (evaluations), folded per step they ran after (0: before any).
Written in one transaction per meter flush (`add`), from the points the schedulers logged.

Bounded: each series keeps its newest ``max_steps`` steps (older ones are deleted as new ones
close), and a point's first ``max_keys`` metric keys (sorted), so a client sending thousands of
custom keys or a million-step run cannot grow the file without limit.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from loraplex.domain.step_metrics import SeriesKind, StepPoint, fold
from loraplex.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS run_steps (
    model_id   TEXT NOT NULL,
    series     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    tenant     TEXT NOT NULL,
    is_open    INTEGER NOT NULL,
    wall_time  REAL NOT NULL,
    num_ops    INTEGER NOT NULL,
    num_data   INTEGER NOT NULL,
    num_tokens INTEGER NOT NULL,
    PRIMARY KEY (model_id, series, step)
);
CREATE TABLE IF NOT EXISTS run_step_metrics (
    model_id TEXT NOT NULL,
    series   TEXT NOT NULL,
    step     INTEGER NOT NULL,
    name     TEXT NOT NULL,
    value    REAL,
    weight   REAL NOT NULL,
    PRIMARY KEY (model_id, series, step, name)
);
"""


@dataclass(frozen=True)
class StepSeries:
    """One series of a run, bucketed: ``bucket`` consecutive steps per point (1: every step).

    Attributes:
        num_steps: closed steps after ``after_step`` (what the buckets cover).
        steps: per point, its last step; ``counts`` how many steps it holds (``bucket``, or
            fewer at the end or after gaps); ``times`` its last wall time; ``tokens`` the
            datum tokens of its steps.
        metrics: per key, the mean over the point's steps (None: no value, or not finite);
            ``lows`` / ``highs`` the minimum and maximum (only when ``bucket`` > 1).
        open_step: the step whose optim_step has not finished yet, and its metrics so far.
    """

    num_steps: int
    bucket: int
    steps: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    metrics: dict[str, list[float | None]] = field(default_factory=dict)
    lows: dict[str, list[float | None]] = field(default_factory=dict)
    highs: dict[str, list[float | None]] = field(default_factory=dict)
    open_step: tuple[int, dict[str, float | None]] | None = None


MAX_STEPS = 100_000
MAX_KEYS = 64


class RunMetricsStore:
    def __init__(self, db: Database, max_steps: int = MAX_STEPS, max_keys: int = MAX_KEYS
                 ) -> None:
        self._db = db
        self.max_steps = max_steps
        self.max_keys = max_keys

    def add(self, points: Iterable[StepPoint]) -> None:
        """Fold ``points`` (oldest first) into their runs' steps, in one transaction."""
        ordered = sorted(points, key=lambda p: p.wall_time)
        if not ordered:
            return
        with self._db.transaction() as conn:
            last: dict[str, int] = {}
            for point in ordered:
                if point.model_id not in last:
                    last[point.model_id] = _last_closed(conn, point.model_id)
                step = last[point.model_id]
                if len(point.metrics) > self.max_keys:
                    kept = sorted(point.metrics)[:self.max_keys]
                    point = replace(point, metrics={k: point.metrics[k] for k in kept})
                if point.kind == "forward":
                    _fold_into(conn, point, "forward", step, is_open=False)
                else:
                    _fold_into(conn, point, "train", step + 1,
                               is_open=point.kind == "forward_backward")
                    if point.kind == "optim_step":
                        last[point.model_id] = step + 1
            for model_id, step in last.items():
                _prune(conn, model_id, step - self.max_steps)

    def last_step(self, model_id: str) -> int:
        """The run's last closed train step (0: none yet)."""
        with self._db.transaction() as conn:
            return _last_closed(conn, model_id)

    def series(self, model_id: str, series: SeriesKind, *, max_points: int,
               after_step: int = 0) -> StepSeries:
        """The closed steps after ``after_step``, in at most ``max_points`` buckets (the
        ``forward`` series from step 0 on when ``after_step`` is 0: evaluations of the weights
        before any optim step)."""
        if series == "forward" and after_step == 0:
            after_step = -1
        span = self._db.query_one(
            "SELECT COUNT(*) AS n, MIN(step) AS lo, MAX(step) AS hi FROM run_steps WHERE"
            " model_id = ? AND"
            " series = ? AND is_open = 0 AND step > ?", (model_id, series, after_step))
        count = int(span["n"]) if span else 0
        out = StepSeries(count, 1, open_step=self._open_step(model_id, series))
        if span is None or not count:
            return out
        high = int(span["hi"])
        after_step = max(after_step, int(span["lo"]) - 1)  # older steps were pruned
        bucket = max(1, math.ceil((high - after_step) / max(1, max_points)))
        out = StepSeries(count, bucket, open_step=out.open_step)
        args = (after_step, bucket, model_id, series, after_step, high)
        self._bucket_metrics(out, args, self._bucket_steps(out, args))
        return out

    def _bucket_steps(self, out: StepSeries, args: tuple[object, ...]) -> dict[int, int]:
        """Fill ``out``'s points (``args``: after_step, bucket, model_id, series, after_step,
        high); returns bucket number → point index."""
        index: dict[int, int] = {}
        for row in self._db.query(
                "SELECT (step - ?1 - 1) / ?2 AS b, MAX(step) AS step, COUNT(*) AS n,"
                " MAX(wall_time) AS t, SUM(num_tokens) AS tokens FROM run_steps"
                " WHERE model_id = ?3 AND series = ?4 AND is_open = 0 AND step > ?5"
                " AND step <= ?6 GROUP BY b ORDER BY b", args):
            index[int(row["b"])] = len(out.steps)
            out.steps.append(int(row["step"]))
            out.counts.append(int(row["n"]))
            out.times.append(float(row["t"]))
            out.tokens.append(int(row["tokens"]))
        return index

    def _bucket_metrics(self, out: StepSeries, args: tuple[object, ...], index: dict[int, int]
                        ) -> None:
        """Fill ``out``'s metrics (means; minimum and maximum too when points are buckets)."""
        for row in self._db.query(
                "SELECT name, (step - ?1 - 1) / ?2 AS b, AVG(value) AS mean, MIN(value) AS lo,"
                " MAX(value) AS hi FROM run_step_metrics WHERE model_id = ?3 AND series = ?4"
                " AND step > ?5 AND step <= ?6 GROUP BY name, b", args):
            i = index.get(int(row["b"]))
            if i is None:  # metrics of a step still open: not part of the curve
                continue
            name = str(row["name"])
            for target, column in ((out.metrics, "mean"), (out.lows, "lo"), (out.highs, "hi")):
                if out.bucket == 1 and target is not out.metrics:
                    continue
                target.setdefault(name, [None] * len(out.steps))[i] = _finite(row[column])

    def _open_step(self, model_id: str, series: SeriesKind
                   ) -> tuple[int, dict[str, float | None]] | None:
        row = self._db.query_one("SELECT step FROM run_steps WHERE model_id = ? AND series = ?"
                                 " AND is_open = 1", (model_id, series))
        if row is None:
            return None
        step = int(row["step"])
        values = self._db.query("SELECT name, value FROM run_step_metrics WHERE model_id = ?"
                                " AND series = ? AND step = ?", (model_id, series, step))
        return step, {str(r["name"]): _finite(r["value"]) for r in values}


def _prune(conn: sqlite3.Connection, model_id: str, through: int) -> None:
    """Delete both series' steps up to ``through`` (nothing when it is below 1)."""
    if through < 1:
        return
    for table in ("run_steps", "run_step_metrics"):
        conn.execute(f"DELETE FROM {table} WHERE model_id = ? AND step <= ?", (model_id, through))


def _last_closed(conn: sqlite3.Connection, model_id: str) -> int:
    row = conn.execute("SELECT MAX(step) FROM run_steps WHERE model_id = ? AND series = 'train'"
                       " AND is_open = 0", (model_id,)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _fold_into(conn: sqlite3.Connection, point: StepPoint, series: SeriesKind, step: int, *,
               is_open: bool) -> None:
    """Add ``point`` to the row of ``(run, series, step)`` and to each of its metrics."""
    key = (point.model_id, series, step)
    conn.execute(
        "INSERT INTO run_steps (model_id, series, step, tenant, is_open, wall_time, num_ops,"
        " num_data, num_tokens) VALUES (?,?,?,?,?,?,1,?,?) ON CONFLICT (model_id, series, step)"
        " DO UPDATE SET is_open = excluded.is_open, wall_time = excluded.wall_time,"
        " num_ops = num_ops + 1, num_data = num_data + excluded.num_data,"
        " num_tokens = num_tokens + excluded.num_tokens",
        (*key, point.tenant, int(is_open), point.wall_time, point.num_data, point.num_tokens))
    held = {str(r[0]): (r[1], float(r[2])) for r in conn.execute(
        "SELECT name, value, weight FROM run_step_metrics WHERE model_id = ? AND series = ?"
        " AND step = ?", key)}
    weight = float(point.num_data) if point.kind != "optim_step" else 1.0
    rows = []
    for name, value in point.metrics.items():
        folded: float | None
        if name not in held:
            folded, total = value, weight
        else:
            old, old_weight = held[name]
            folded, total = ((None, old_weight + weight) if old is None or not math.isfinite(value)
                             else fold(float(old), old_weight, value, weight, name))
        rows.append((*key, name, _finite(folded), total))
    conn.executemany("INSERT OR REPLACE INTO run_step_metrics (model_id, series, step, name,"
                     " value, weight) VALUES (?,?,?,?,?,?)", rows)


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None
