"""``GET /api/v1/loraplex/training_runs/{model_id}/metrics`` as sent: a run's two series of
per-step curves (`store.run_metrics.StepSeries`), one array per field."""

from __future__ import annotations

from pydantic import BaseModel, Field

Curves = dict[str, list[float | None]]
"""Metric key → one value per point (null: no value, or not finite)."""


class OpenStep(BaseModel):
    """The step still waiting for its optim_step, and its metrics so far."""

    step: int
    metrics: dict[str, float | None]


class StepSeriesView(BaseModel):
    """``bucket`` consecutive steps per point; ``min`` / ``max`` only when ``bucket`` > 1."""

    num_steps: int
    bucket: int
    step: list[int] = Field(description="per point, its last step")
    count: list[int]
    time: list[float]
    tokens: list[int]
    metrics: Curves = Field(description="per key, the mean over each point's steps")
    min: Curves | None = None
    max: Curves | None = None
    open_step: OpenStep | None


class RunMetrics(BaseModel):
    model_id: str
    num_steps: int
    num_trained_tokens: int
    after_step: int
    train: StepSeriesView = Field(description="one point per optim step")
    forward: StepSeriesView = Field(description="forward-only evaluations")
