"""Evaluation scores kept with checkpoints: ``POST /api/v1/loraplex/evals`` stores a run's
scores on one of the caller's own checkpoints (what `loraplex eval` sends after lm-eval
finishes), ``GET /api/v1/loraplex/evals?path=…`` lists those of checkpoints the caller may read
(its own, or published ones). Another tenant's private checkpoint is a 404 either way."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request

from loraplex.api import schemas
from loraplex.api.access import readable_checkpoint
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.responses.evals import EvalScoresResponse, StoredEvalScores
from loraplex.domain.eval_score import EvalScore
from loraplex.domain.ids import TinkerPath
from loraplex.errors import user_error

router = APIRouter(prefix="/api/v1/loraplex")
MAX_PATHS = 100


@router.post("/evals", response_model_exclude_unset=True)
async def put_evals(request: Request, tenant: Tenant) -> StoredEvalScores:
    ctx, body = await parse_body(request, schemas.PutEvalScoresRequest)
    scores = [EvalScore(s.task, s.metric, s.value, s.stderr, s.num_samples).validate(
        f"scores[{i}]") for i, s in enumerate(body.scores)]
    path = str(ctx.stores.checkpoints.get_owned(TinkerPath.parse(body.path, "path"), tenant,
                                                "path").path)
    stored = await asyncio.to_thread(ctx.stores.eval_scores.put, path, scores)
    return StoredEvalScores(path=path, scores=stored)


@router.get("/evals", response_model_exclude_unset=True)
async def get_evals(request: Request, tenant: Tenant,
                    path: Annotated[list[str] | None, Query()] = None) -> EvalScoresResponse:
    ctx = ctx_of(request)
    path = path or []
    if not 1 <= len(path) <= MAX_PATHS:
        raise user_error("path", f"give 1-{MAX_PATHS} checkpoint paths")
    return EvalScoresResponse(
        evals=await asyncio.to_thread(_readable_scores, ctx, tenant, path))


def _readable_scores(ctx: ServerContext, tenant: str, paths: list[str]
                     ) -> dict[str, list[EvalScore]]:
    readable = [str(readable_checkpoint(ctx, tenant, p)[0].path) for p in paths]
    return ctx.stores.eval_scores.list_for(readable)
