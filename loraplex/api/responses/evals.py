"""Evaluation scores kept with checkpoints, as ``/api/v1/loraplex/evals`` and the tenant view
send them: each a `domain.eval_score.EvalScore` (its fields in order)."""

from __future__ import annotations

from pydantic import BaseModel

from loraplex.domain.eval_score import EvalScore


class StoredEvalScores(BaseModel):
    """What ``POST`` stored: the checkpoint's ``tinker://`` path and all its scores now."""

    path: str
    scores: list[EvalScore]


class EvalScoresResponse(BaseModel):
    """``GET``: the scores of each checkpoint asked about, by ``tinker://`` path."""

    evals: dict[str, list[EvalScore]]
