"""Sampling: create_sampling_session (base model or a checkpoint), GET samplers/{id}, and
asample, which answers the request id plus one ``sample_sequence_ids`` entry per sample
(tinker-api.md §5.5). Over-limit tenants get 429, the SDK's sampling backpressure signal."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, Request
from tinker import types as sdk

from loraplex.api import convert, model_input, schemas
from loraplex.api.access import checkpoint_adapter_id, readable_checkpoint
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.completion_feeds import CompletionFeeds
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.submission import new_request_id
from loraplex.config import LimitsConfig
from loraplex.domain import ids
from loraplex.domain.ops import Admitted, SampleOp, WorkItem
from loraplex.domain.tokens import check_token_range
from loraplex.domain.work import SampleWork
from loraplex.errors import user_error
from loraplex.scheduler.catalog import ServedModel
from loraplex.store.samplers import SamplerRecord, new_record

router = APIRouter(prefix="/api/v1")

CLONE_SEQ_IDS = 1_000_000_000
"""A cloned SamplingClient's seq ids are clone × 10⁹ + n (the SDK's layout): its feed for
``retrieve_futures`` is ``seq_id // CLONE_SEQ_IDS``."""


def _binding(ctx: ServerContext, tenant: str, *, base_model: str | None,
             model_path: str | None, field: str = "model_path") -> dict[str, Any]:
    """Sampler fields for sampling ``model_path`` (a readable checkpoint) or a bare base."""
    if model_path is not None:
        record, run = readable_checkpoint(ctx, tenant, model_path, field)
        served = ctx.catalog.get(base_model or run.base_model, "base_model")
        return dict(base_model=served.name, model_path=model_path, source="checkpoint",
                    model_id=None, adapter_id=checkpoint_adapter_id(record),
                    adapter_dir=record.directory)
    if base_model is None:
        raise user_error("base_model", "give base_model or model_path")
    served = ctx.catalog.get(base_model)
    return dict(base_model=served.name, model_path=None, source="base", model_id=None,
                adapter_id=None, adapter_dir=None)


@router.post("/create_sampling_session")
async def create_sampling_session(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx, body = await parse_body(request, schemas.CreateSamplingSessionRequest)
    ctx.stores.sessions.get_open(body.session_id, tenant)
    sampler_id = ids.sampling_session_id(body.session_id, body.sampling_session_seq_id)
    existing = ctx.stores.samplers.find(sampler_id)
    if existing is None:
        binding = _binding(ctx, tenant, base_model=body.base_model, model_path=body.model_path)
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


def sample_request(tokens: list[int], num_samples: int, params: sdk.SamplingParams,
                   topk_sample_logprobs: int, echo: bool = False) -> schemas.SampleRequest:
    """The ``asample`` body that asks for what the OpenAI-compatible routes ask for (with
    ``echo``: the prompt's logprobs too, and its top-k when sampled tokens have them)."""
    return schemas.SampleRequest(num_samples=num_samples, prompt=sdk.ModelInput.from_ints(tokens),
                                 sampling_params=params,
                                 topk_sample_logprobs=topk_sample_logprobs,
                                 prompt_logprobs=echo or None,
                                 topk_prompt_logprobs=topk_sample_logprobs if echo else 0)


def submit_sample(ctx: ServerContext, tenant: str, body: schemas.SampleRequest,
                  sampler: SamplerRecord, images_decoded: bool = False) -> Admitted:
    """Validate ``body`` and queue it on ``sampler``'s model: the one path every sample takes
    (``asample`` and the OpenAI-compatible routes), so equal requests sample equally.

    Raises:
        UserError: a bad field (nothing is queued); CapacityError: the tenant is over its
            sampling limits (HTTP 429).
    """
    return admit_sample(prepare_sample(ctx, tenant, body, sampler,
                                       images_decoded=images_decoded))


@dataclass(frozen=True)
class PreparedSample:
    """A validated sample request, not yet queued (`admit_sample` queues it)."""

    served: ServedModel
    item: WorkItem
    sequence_ids: tuple[str, ...]
    prompt_length: int = 0


def prepare_sample(ctx: ServerContext, tenant: str, body: schemas.SampleRequest,
                   sampler: SamplerRecord, stream: bool = False, ignore_eos: bool = False,
                   images_decoded: bool = False) -> PreparedSample:
    """Everything `submit_sample` checks, without queueing: a request of several prompts
    checks them all before it queues any. ``stream``: its tokens are reported while it runs
    (`FutureStore.take_progress`); ``ignore_eos``: EOS does not stop it (stop strings do);
    ``images_decoded``: the prompt's images were decoded off the event loop already.

    Raises:
        UserError: a bad field.
    """
    served = ctx.catalog.get(sampler.base_model)
    request_id = new_request_id()
    work = _sample_work(body, served, sampler, request_id, ctx.config.limits, images_decoded)
    stop = replace(work.params.stop, use_eos=work.params.stop.use_eos and not ignore_eos)
    work = replace(work, stream=stream, params=replace(work.params, stop=stop))
    sequence_ids = tuple(f"{request_id}:{i}" for i in range(body.num_samples))
    key = ((sampler.sampler_id, body.seq_id)
           if body.seq_id is not None and body.sampling_session_id is not None else None)
    op = SampleOp(work, sequence_ids, source=sampler.source, model_id=sampler.model_id,
                  record_for_session=sampler.session_id if body.record_stability_info else None,
                  base_model=served.name, usage_run_id=_usage_run(sampler))
    return PreparedSample(served, WorkItem(request_id, tenant, "Sample", op, sampler_key=key),
                          sequence_ids, len(work.prompt))


def admit_sample(prepared: PreparedSample) -> Admitted:
    """Queue a prepared sample. Raises CapacityError over the tenant's sampling limits."""
    return prepared.served.lanes.submit(prepared.item, prepared.sequence_ids)


def _usage_run(sampler: SamplerRecord) -> str | None:
    """The training run a sample's usage is attributed to (None: the bare base model)."""
    if sampler.model_id is not None:
        return sampler.model_id
    return ids.TinkerPath.parse(sampler.model_path).run_id if sampler.model_path else None


def sampler_for(ctx: ServerContext, tenant: str, body: schemas.SampleRequest) -> SamplerRecord:
    """The sampler ``body`` names: its sampling session, else its model_path or base model."""
    if body.sampling_session_id is not None:
        return session_sampler(ctx, tenant, body.sampling_session_id)
    binding = _binding(ctx, tenant, base_model=body.base_model, model_path=body.model_path)
    return new_record(sampler_id="", tenant=tenant, session_id="", **binding)


def base_sampler(ctx: ServerContext, tenant: str, base_model: str, field: str) -> SamplerRecord:
    """An unsaved sampler of the bare base model ``base_model`` (a served name)."""
    ctx.catalog.get(base_model, field)
    binding = _binding(ctx, tenant, base_model=base_model, model_path=None)
    return new_record(sampler_id="", tenant=tenant, session_id="", **binding)


def path_sampler(ctx: ServerContext, tenant: str, model_path: str, field: str) -> SamplerRecord:
    """An unsaved sampler of a readable checkpoint (what ``asample`` with model_path uses)."""
    binding = _binding(ctx, tenant, base_model=None, model_path=model_path, field=field)
    return new_record(sampler_id="", tenant=tenant, session_id="", **binding)


def session_sampler(ctx: ServerContext, tenant: str, sampler_id: str,
                    field: str = "sampling_session_id") -> SamplerRecord:
    """The caller's sampling session ``sampler_id`` (another tenant's: NotFoundError)."""
    record = ctx.stores.samplers.get(sampler_id, tenant, field)
    if record.source != "checkpoint" or record.model_path is None:
        return record
    # Checked on every sample: a checkpoint deleted, unpublished (for other tenants) or
    # replaced since the session was made is not sampled from its old weights.
    binding = _binding(ctx, tenant, base_model=record.base_model, model_path=record.model_path)
    return replace(record, adapter_id=binding["adapter_id"], adapter_dir=binding["adapter_dir"])


def _sample_work(body: schemas.SampleRequest, served: ServedModel, sampler: SamplerRecord,
                 request_id: str, limits: LimitsConfig, images_decoded: bool) -> SampleWork:
    if body.target_prompt_logprobs is not None:
        raise user_error("target_prompt_logprobs", "not supported by this server")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        if getattr(body, name) < 0:
            raise user_error(name, "must be ≥ 0")
    prompt, images = convert.prompt_tokens(body.prompt, served.info, limits=limits,
                                           decoded=images_decoded)
    last_n = body.prompt_logprobs_last_n
    if last_n is not None and (not body.prompt_logprobs or not 1 <= last_n <= len(prompt) - 1):
        raise user_error("prompt_logprobs_last_n",
                         f"needs prompt_logprobs and 1 ≤ n ≤ {len(prompt) - 1}")
    params = convert.sampling_params(body.sampling_params, body.num_samples)
    if params.stop.token_ids:
        check_token_range(params.stop.token_ids, served.info.vocab_size, "sampling_params.stop")
    return SampleWork(
        request_id=request_id, adapter_id=sampler.adapter_id, adapter_dir=sampler.adapter_dir,
        prompt=prompt, num_samples=body.num_samples, params=params,
        prompt_logprobs=bool(body.prompt_logprobs),
        topk_prompt_logprobs=body.topk_prompt_logprobs,
        topk_sample_logprobs=body.topk_sample_logprobs, prompt_logprobs_last_n=last_n,
        prompt_alt_tokens_k=body.prompt_alt_tokens_k, images=images)
