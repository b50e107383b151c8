"""Samplers and sample requests, shared by every route that samples: which sampler a request
names (a sampling session, a readable checkpoint, a served base model), and the one validation
and queueing path a sample takes (`prepare_sample` + `admit_sample`, or `submit_sample`), so
``asample`` and the OpenAI-compatible routes sample equal requests equally. `resolve` maps an
OpenAI ``model`` field to its sampler, served model and tokenizer. Knows nothing of HTTP
routing: routes call it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, TypedDict

from fastapi import Request
from tinker import types as sdk

from loraplex.api import convert, schemas
from loraplex.api.access import checkpoint_adapter_id, readable_checkpoint
from loraplex.api.context import ServerContext
from loraplex.api.openai_text import ModelText, ModelTexts
from loraplex.api.submission import new_request_id
from loraplex.config import LimitsConfig
from loraplex.domain import ids
from loraplex.domain.ids import TINKER_SCHEME, TinkerPath
from loraplex.domain.ops import Admitted, SampleOp, WorkItem
from loraplex.domain.tokens import check_token_range
from loraplex.domain.work import SampleWork
from loraplex.errors import NotFoundError, user_error
from loraplex.scheduler.catalog import ServedModel
from loraplex.store.samplers import SamplerRecord, new_record


class SamplerBinding(TypedDict):
    """What a sampler samples: `SamplerRecord`'s fields besides its ids and time."""

    base_model: str
    model_path: str | None
    source: Literal["checkpoint", "base"]
    model_id: str | None
    adapter_id: str | None
    adapter_dir: str | None


def sampler_binding(ctx: ServerContext, tenant: str, *, base_model: str | None,
                    model_path: str | None, field: str = "model_path") -> SamplerBinding:
    """Sampler fields for sampling ``model_path`` (a readable checkpoint) or a bare base."""
    if model_path is not None:
        record, run = readable_checkpoint(ctx, tenant, model_path, field)
        served = ctx.catalog.get(base_model or run.base_model, "base_model")
        return SamplerBinding(base_model=served.name, model_path=model_path,
                              source="checkpoint", model_id=None,
                              adapter_id=checkpoint_adapter_id(record),
                              adapter_dir=record.directory)
    if base_model is None:
        raise user_error("base_model", "give base_model or model_path")
    served = ctx.catalog.get(base_model)
    return SamplerBinding(base_model=served.name, model_path=None, source="base",
                          model_id=None, adapter_id=None, adapter_dir=None)


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
    binding = sampler_binding(ctx, tenant, base_model=body.base_model, model_path=body.model_path)
    return new_record(sampler_id="", tenant=tenant, session_id="", **binding)


def base_sampler(ctx: ServerContext, tenant: str, base_model: str, field: str) -> SamplerRecord:
    """An unsaved sampler of the bare base model ``base_model`` (a served name)."""
    ctx.catalog.get(base_model, field)
    binding = sampler_binding(ctx, tenant, base_model=base_model, model_path=None)
    return new_record(sampler_id="", tenant=tenant, session_id="", **binding)


def path_sampler(ctx: ServerContext, tenant: str, model_path: str, field: str) -> SamplerRecord:
    """An unsaved sampler of a readable checkpoint (what ``asample`` with model_path uses)."""
    binding = sampler_binding(ctx, tenant, base_model=None, model_path=model_path, field=field)
    return new_record(sampler_id="", tenant=tenant, session_id="", **binding)


def session_sampler(ctx: ServerContext, tenant: str, sampler_id: str,
                    field: str = "sampling_session_id") -> SamplerRecord:
    """The caller's sampling session ``sampler_id`` (another tenant's: NotFoundError)."""
    record = ctx.stores.samplers.get(sampler_id, tenant, field)
    if record.source != "checkpoint" or record.model_path is None:
        return record
    # Checked on every sample: a checkpoint deleted, unpublished (for other tenants) or
    # replaced since the session was made is not sampled from its old weights.
    binding = sampler_binding(ctx, tenant, base_model=record.base_model,
                              model_path=record.model_path)
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


@dataclass(frozen=True)
class Target:
    """What a request's ``model`` resolves to."""

    sampler: SamplerRecord
    served: ServedModel
    text: ModelText


def resolve(request: Request, ctx: ServerContext, tenant: str, model: str) -> Target:
    """``model`` → the sampler, its served model and tokenizer.

    Raises:
        NotFoundError: no such model, session or checkpoint for this caller (HTTP 404).
    """
    if model.startswith(TINKER_SCHEME):
        if TinkerPath.parse(model, "model").kind != "sampler_weights":
            raise user_error("model", "expected a tinker://…/sampler_weights/… path")
        sampler = path_sampler(ctx, tenant, model, "model")
    elif ":sample:" in model:
        sampler = session_sampler(ctx, tenant, model, "model")
    elif model in {m.name for m in ctx.catalog}:
        sampler = base_sampler(ctx, tenant, model, "model")
    else:
        raise NotFoundError(f"model: no model {model!r} (GET /v1/models lists them)",
                            field="model")
    served = ctx.catalog.get(sampler.base_model, "model")
    texts: ModelTexts = request.app.state.model_texts
    return Target(sampler, served, texts.of(served))
