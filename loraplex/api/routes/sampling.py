"""Sampling: create_sampling_session (base model or a checkpoint), GET samplers/{id}, and
asample, which answers the request id plus one ``sample_sequence_ids`` entry per sample
(tinker-api.md §5.5). Over-limit tenants get 429, the SDK's sampling backpressure signal."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api import model_input, samplers, schemas
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.completion_feeds import CompletionFeeds
from loraplex.api.context import ctx_of
from loraplex.api.samplers import sampler_for, submit_sample
from loraplex.domain import ids
from loraplex.errors import user_error
from loraplex.store.samplers import new_record

router = APIRouter(prefix="/api/v1")

CLONE_SEQ_IDS = 1_000_000_000
"""A cloned SamplingClient's seq ids are clone × 10⁹ + n (the SDK's layout): its feed for
``retrieve_futures`` is ``seq_id // CLONE_SEQ_IDS``."""


@router.post("/create_sampling_session")
async def create_sampling_session(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx, body = await parse_body(request, schemas.CreateSamplingSessionRequest)
    ctx.stores.sessions.get_open(body.session_id, tenant)
    sampler_id = ids.sampling_session_id(body.session_id, body.sampling_session_seq_id)
    existing = ctx.stores.samplers.find(sampler_id)
    if existing is None:
        binding = samplers.sampler_binding(ctx, tenant, base_model=body.base_model,
                                           model_path=body.model_path)
        ctx.stores.samplers.insert(new_record(sampler_id=sampler_id, tenant=tenant,
                                              session_id=body.session_id, **binding))
    elif existing.tenant != tenant:
        raise user_error("sampling_session_seq_id", "already used")
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, request: Request, tenant: Tenant) -> dict[str, Any]:
    record = ctx_of(request).stores.samplers.get(sampler_id, tenant, "sampler_id")
    return {"sampler_id": record.sampler_id, "base_model": record.base_model,
            "model_path": record.model_path}


@router.post("/asample")
async def asample(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx, body = await parse_body(request, schemas.SampleRequest)
    if model_input.has_images(body.prompt):  # decoding is CPU work: off the event loop
        await asyncio.to_thread(model_input.check_prompt_images, body.prompt, ctx.config.limits)
    admitted = submit_sample(ctx, tenant, body, sampler_for(ctx, tenant, body),
                             images_decoded=True)
    if body.sampling_session_id is not None and body.seq_id is not None:
        feeds: CompletionFeeds = request.app.state.completion_feeds
        feeds.watch((tenant, body.sampling_session_id, body.seq_id // CLONE_SEQ_IDS),
                    admitted.request_id)
    return {"request_id": admitted.request_id,
            "sample_sequence_ids": list(admitted.sample_sequence_ids)}
