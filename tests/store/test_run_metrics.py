"""The run-metrics store: ops folded into steps the way the SDK folds a call's chunks, the open
step kept out of the curve, bucketed reads (mean, min, max per bucket, checked against numbers
computed here), and the bounds on steps and keys."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loraplex.domain.step_metrics import PointKind, StepPoint
from loraplex.store.db import Database
from loraplex.store.run_metrics import SCHEMA, RunMetricsStore


def store(tmp_path: Path, **kwargs: int) -> RunMetricsStore:
    return RunMetricsStore(Database(str(tmp_path / "m.sqlite3"), (SCHEMA,)), **kwargs)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def point(self, kind: PointKind, metrics: dict[str, float], num_data: int = 0,
              model_id: str = "run-a") -> StepPoint:
        self.t += 1.0
        return StepPoint(model_id, "alice", kind, metrics, num_data, 4 * num_data, self.t)


def test_chunks_of_a_step_fold_like_the_sdk_and_the_open_step_stays_apart(
        tmp_path: Path) -> None:
    s, c = store(tmp_path), Clock()
    s.add([c.point("forward", {"loss:sum": 9.0}, 1),  # an evaluation before any step
           c.point("forward_backward", {"loss:sum": 2.0, "acc:mean": 0.5, "lo:min": 3.0,
                                        "hi:max": 1.0}, 2),
           c.point("forward_backward", {"loss:sum": 3.0, "acc:mean": 0.8, "lo:min": 1.0,
                                        "hi:max": 4.0}, 1)])
    s.add([c.point("optim_step", {"grad_norm:mean": 0.7, "learning_rate:mean": 1e-3}),
           c.point("forward_backward", {"loss:sum": 1.5, "bad:mean": math.nan}, 3)])
    train = s.series("run-a", "train", max_points=100)
    assert train.steps == [1] and train.tokens == [12] and train.bucket == 1
    assert train.metrics["loss:sum"] == [5.0]
    assert train.metrics["acc:mean"] == [pytest.approx((0.5 * 2 + 0.8 * 1) / 3)]
    assert train.metrics["lo:min"] == [1.0] and train.metrics["hi:max"] == [4.0]
    assert train.metrics["grad_norm:mean"] == [0.7]
    assert train.open_step == (2, {"loss:sum": 1.5, "bad:mean": None})
    assert "bad:mean" not in train.metrics  # only the open step has it
    forward = s.series("run-a", "forward", max_points=100)
    assert forward.steps == [0] and forward.metrics["loss:sum"] == [9.0]
    assert s.last_step("run-a") == 1 and s.last_step("run-b") == 0


def test_long_series_come_back_bucketed_with_min_and_max(tmp_path: Path) -> None:
    s, c = store(tmp_path), Clock()
    losses = [10.0 / (1 + i) for i in range(10)]
    for loss in losses:
        s.add([c.point("forward_backward", {"loss:sum": loss}, 1),
               c.point("optim_step", {})])
    out = s.series("run-a", "train", max_points=4)  # 10 steps → buckets of 3
    assert out.bucket == 3 and out.num_steps == 10 and out.steps == [3, 6, 9, 10]
    assert out.counts == [3, 3, 3, 1] and out.tokens == [12, 12, 12, 4]
    groups = [losses[0:3], losses[3:6], losses[6:9], losses[9:]]
    assert out.metrics["loss:sum"] == pytest.approx([sum(g) / len(g) for g in groups])
    assert out.lows["loss:sum"] == pytest.approx([min(g) for g in groups])
    assert out.highs["loss:sum"] == pytest.approx([max(g) for g in groups])
    after = s.series("run-a", "train", max_points=100, after_step=7)
    assert after.steps == [8, 9, 10] and after.metrics["loss:sum"] == pytest.approx(losses[7:])


def test_steps_and_keys_are_bounded(tmp_path: Path) -> None:
    s, c = store(tmp_path, max_steps=5, max_keys=3), Clock()
    for i in range(12):
        s.add([c.point("forward_backward", {f"k{j}:mean": float(i) for j in range(10)}, 1),
               c.point("optim_step", {})])
    out = s.series("run-a", "train", max_points=100)
    assert out.steps == [8, 9, 10, 11, 12] and out.bucket == 1
    assert sorted(out.metrics) == ["k0:mean", "k1:mean", "k2:mean"]
    assert s.last_step("run-a") == 12
    s.add([c.point("forward_backward", {"loss:sum": 1.0}, 1), c.point("optim_step", {})])
    assert s.series("run-a", "train", max_points=100).steps == [9, 10, 11, 12, 13]
